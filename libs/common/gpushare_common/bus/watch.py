"""Follow a key-value bucket: its current keys, then every change, without reading it again.

:func:`watch_bucket` yields :class:`KeyChanges`: first one with ``reset=True`` holding every
live key that matches (the caller replaces what it had), then one per burst of changes (a
deleted or purged key has ``value=None``). It asks the server for nothing but a short-lived,
filtered push consumer (memory storage, no acks, idle heartbeats) delivered to the
connection's own inbox, under the one name the read-only ``observer`` role may create and
delete (``observer-<instance>``, the same in every node's domain: nobody else's consumer can
be touched). When the consumer is lost (no message nor heartbeat for three heartbeats: a
server or a leaf restarted, a leader moved) or skips a message, it is made again and the
next batch is a reset again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from nats.js import api
from nats.js.errors import NotFoundError

from ..retry import Backoff, Supervised
from ..subjects import js_consumer_create, kv_key, kv_key_of, kv_stream
from .connection import Bus
from .errors import FAILURES, BusError, Transient, failing

_DELETED = ("DEL", "PURGE")


@dataclass(frozen=True, slots=True)
class KeyChange:
    key: str  # the key in the bucket, as stored (``<node>.<kind>.<escaped key>``)
    value: bytes | None  # None: deleted


@dataclass(frozen=True, slots=True)
class KeyChanges:
    reset: bool  # True: ``changes`` is every live key (forget what came before)
    changes: tuple[KeyChange, ...]


async def watch_bucket(bus: Bus, bucket: str, keys: str, stop: asyncio.Event, heartbeat_s: float = 2.0,
                       domain: str = "", consumer: str = "observer-console") -> AsyncIterator[KeyChanges]:  # fmt: skip
    """Changes of the keys of ``bucket`` (a name of ``layout.BUCKETS``) matching ``keys`` (a NATS
    subject pattern: ``*.mapping.>``) until ``stop``, of the server connected to or of JetStream
    domain ``domain`` (a node's leaf server); see the module doc."""
    name = bus.layout.bucket(bucket)
    async for watch in Supervised(f"watch {name}", stop, Backoff(0.1, 5.0), service=bus.service, keys=keys):
        try:
            async for batch in _one_watch(bus, name, keys, stop, heartbeat_s, domain, consumer):
                watch.progress()
                yield batch
        except BusError as err:  # lost (a server or a leaf restarted, a leader moved): watched again
            watch.failed(err)


async def _one_watch(bus: Bus, bucket: str, keys: str, stop: asyncio.Event, heartbeat_s: float,
                     domain: str, consumer: str) -> AsyncIterator[KeyChanges]:  # fmt: skip
    nc = bus.client
    queue: asyncio.Queue[Any] = asyncio.Queue()
    with failing(f"watch {bucket}"):
        sub = await nc.subscribe(nc.new_inbox(), cb=queue.put)
    try:
        pending = await _create(bus, bucket, kv_key(bucket, keys), sub.subject, heartbeat_s, domain, consumer)
        batch: list[KeyChange] = []
        reset, consumer_seq = True, 0
        while not stop.is_set():
            if (reset and pending <= 0) or (not reset and batch):
                yield KeyChanges(reset, tuple(batch))
                batch, reset = [], False
            msg = await _next(queue, stop, 3 * heartbeat_s, bucket)
            for item in [msg, *_queued(queue)] if msg is not None else []:
                if _is_status(item):
                    continue
                meta = item.metadata
                if meta.sequence.consumer != consumer_seq + 1:
                    raise Transient(f"watch {bucket}", f"skipped from {consumer_seq} to {meta.sequence.consumer}")
                consumer_seq, pending = meta.sequence.consumer, int(meta.num_pending)
                deleted = (item.headers or {}).get("KV-Operation") in _DELETED
                batch.append(KeyChange(kv_key_of(bucket, item.subject), None if deleted else bytes(item.data)))
    finally:
        with contextlib.suppress(*FAILURES):  # gone with its connection
            await sub.unsubscribe()


async def _create(bus: Bus, bucket: str, subject: str, deliver: str, heartbeat_s: float, domain: str,
                  consumer: str) -> int:  # fmt: skip
    """The watch's consumer, made fresh under the observer's own name (the one left by a lost
    watch is deleted first: updated, it would not start again from every key)."""
    config = api.ConsumerConfig(name=consumer, filter_subject=subject, deliver_subject=deliver,
                                deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT, ack_policy=api.AckPolicy.NONE,
                                idle_heartbeat=heartbeat_s, inactive_threshold=max(10.0, 5 * heartbeat_s),
                                mem_storage=True, num_replicas=1)  # fmt: skip
    jsm = bus.client.jetstream(domain=domain or None)._jsm
    with failing(f"watch {bucket}", bus.explaining(js_consumer_create(kv_stream(bucket), consumer, subject, domain))):
        with contextlib.suppress(NotFoundError):
            await jsm.delete_consumer(kv_stream(bucket), consumer)
        info = await jsm.add_consumer(kv_stream(bucket), config)
    return int(info.num_pending or 0)


async def _next(queue: asyncio.Queue[Any], stop: asyncio.Event, window: float, bucket: str) -> Any:
    """The next message; None when stopping; Transient when nothing came for ``window``."""
    getter = asyncio.ensure_future(queue.get())
    stopper = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({getter, stopper}, timeout=window, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if not getter.done():
            getter.cancel()
    if getter in done:
        return getter.result()
    if stop.is_set():
        return None
    raise Transient(f"watch {bucket}", f"no message nor heartbeat for {window:.0f}s")


def _is_status(msg: Any) -> bool:
    """A heartbeat or flow-control message (status 100, no payload)."""
    return bool(msg.headers) and msg.headers.get("Status") == "100" and not msg.data


def _queued(queue: asyncio.Queue[Any]) -> list[Any]:
    """Every message already queued (a burst becomes one batch)."""
    found = []
    while not queue.empty():
        found.append(queue.get_nowait())
    return found
