"""JetStream: the event stream and the buckets (created by the installer), durable consumers,
and reading a window of the stream.

Ack policy of a durable consumer (declared where it is consumed, :class:`AckPolicy`):
the handler returns -> ack; it raises one of the policy's ``invalid`` types (the
message itself is wrong: it would fail the same way forever) -> the message is
terminated, logged with its reason and counted (``gpushare_bus_terminated{reason}``);
one of :data:`~.errors.BUGS` (a ``TypeError``, a ``KeyError``: a mistake in the code) ->
logged with its traceback, counted (``gpushare_bus_messages{outcome="bug"}``) and nak'd: the
message waits for the fix, it is not lost; anything else (a server, the API, containerd or
a peer failed: transient or not, that is no fault of the message) -> nak with a growing
delay, redelivered without limit, never lost. An undecodable message is terminated at once.
Long handlers keep their message with in-progress acks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import NotFoundError

from ..events import AnyEvent, decode, event_tag
from ..layout import BUCKETS
from ..logging import get_logger
from ..retry import Backoff, Supervised, retry
from .connection import Bus, Handler
from .durable import Durable
from .errors import BUGS, FAILURES, NotFound, Transient, classify, failing

log = get_logger("bus")


@dataclass(frozen=True, slots=True)
class AckPolicy:
    invalid: tuple[type[BaseException], ...] = ()  # the message is wrong: terminate it
    backoff: Backoff | None = None  # nak delays by delivery count (default 0.05 s doubling to 5 s)
    ack_wait_s: float = 30.0
    check_s: float = 30.0  # how often the durable's configuration is checked (and healed, .durable)

    def delay(self, deliveries: int) -> float:
        return (self.backoff or Backoff(0.05, 5.0)).delay_for(deliveries)


@dataclass(frozen=True, slots=True)
class StreamMessage:
    seq: int
    subject: str
    data: bytes
    time: float  # when the stream stored it (Unix seconds)

    def event(self) -> AnyEvent:
        return decode(self.data)


# --- the installer's part ----------------------------------------------------------

async def ensure_layout(bus: Bus, node: str = "") -> None:
    """Create or update the event stream and every bucket (the installer's job): of one node on
    its leaf server (``node``), or of every node on one server."""
    s, js = bus.settings, bus.client.jetstream()
    stream = api.StreamConfig(name=s.stream, subjects=bus.layout.stream_subjects(node), max_age=s.stream_max_age_s,
                              max_bytes=s.stream_max_bytes, storage=api.StorageType.FILE,
                              num_replicas=s.stream_replicas, duplicate_window=120.0, allow_direct=True)
    with failing("create the stream and buckets"):
        try:
            await js.stream_info(s.stream)
            await js.update_stream(stream)
        except NotFoundError:
            await js.add_stream(stream)
        for name in BUCKETS:
            await _ensure_bucket(bus, bus.layout.bucket(name))
    log.info("stream and buckets ready", stream=s.stream, replicas=s.stream_replicas, node=node or "every node",
             buckets=",".join(bus.layout.bucket(b) for b in BUCKETS))  # fmt: skip


async def _ensure_bucket(bus: Bus, bucket: str) -> None:
    js = bus.client.jetstream()
    config = api.KeyValueConfig(bucket=bucket, history=1, storage=api.StorageType.FILE,
                                replicas=bus.settings.stream_replicas, direct=True)
    try:
        await js.key_value(bucket)
    except NotFoundError:
        await js.create_key_value(config)


async def wait_for_stream(bus: Bus, stop: asyncio.Event | None = None) -> None:
    """Wait until the event stream exists (created by the installer, or here when the settings
    ask services to create the layout themselves). Asked with a direct get of a subject of the
    service's own that nothing publishes (``Layout.presence``): the stream answers "no message";
    no stream, no answer. (``STREAM.INFO`` is not for node roles: it lists every node's keys.)"""
    async def attempt() -> None:
        if bus.settings.ensure_layout:
            await ensure_layout(bus)
            return
        presence = bus.layout.presence(bus.node or "nobody")
        try:
            await bus.client.jetstream().get_msg(bus.settings.stream, subject=presence, direct=True)
        except NotFoundError:
            return  # the stream answered: it exists
        except FAILURES as err:
            failure = classify(f"stream {bus.settings.stream}", err)
            raise Transient(failure.op, f"{failure.reason} (is the installer done?)") from err

    await retry(attempt, (Transient,), f"wait for stream {bus.settings.stream}", stop, Backoff(0.1, 5.0),
                service=bus.service)  # fmt: skip


# --- durable consumers -----------------------------------------------------------

async def consume(bus: Bus, subject: str, durable: str, handler: Handler, policy: AckPolicy,
                  stop: asyncio.Event, batch: int = 16) -> None:  # fmt: skip
    """Run a durable pull consumer of ``subject`` until ``stop``; survives server restarts. Its
    configuration is checked when bound and every ``policy.check_s`` (:mod:`.durable`)."""
    sub: Any = None
    consumer = Durable(bus, subject, durable, policy.ack_wait_s)
    checked = time.monotonic()
    try:
        async for fetch in Supervised(f"consume {durable}", stop, Backoff(0.05, 2.0), service=bus.service):
            try:
                if sub is not None and time.monotonic() - checked >= policy.check_s:
                    checked = time.monotonic()
                    if await consumer.check():
                        await _unsubscribe(sub)
                        sub = None
                if sub is None:
                    sub = await consumer.bind()
                    checked = time.monotonic()
                msgs = await sub.fetch(batch, timeout=0.5)
            except FAILURES as err:
                failure = classify(f"fetch {durable}", err)
                if "timeout" not in failure.reason.lower() or sub is None:  # else: nothing to fetch
                    fetch.failed(failure)
                    sub = None
                continue
            fetch.progress()
            for msg in msgs:
                await _handle(bus, msg, handler, policy)
    finally:
        if sub is not None:
            await _unsubscribe(sub)


async def _unsubscribe(sub: Any) -> None:
    with contextlib.suppress(*FAILURES):  # stopping: a lost connection took it along
        await sub.unsubscribe()


async def _handle(bus: Bus, msg: Msg, handler: Handler, policy: AckPolicy) -> None:
    m = bus.metrics
    event = bus.decode(msg)
    if event is None:
        await _settle(msg.term(), "term")
        m.terminated.labels("undecodable").inc()
        return
    keeper = asyncio.ensure_future(_keep_in_progress(msg, policy.ack_wait_s / 3))
    try:
        await handler(event)
    except policy.invalid as err:
        m.dropped.inc()
        m.terminated.labels(type(err).__name__).inc()
        log.error("invalid message terminated", service=bus.service, subject=msg.subject, event=event_tag(event),
                  id=event.id, reason=str(err))  # fmt: skip
        await _settle(msg.term(), "term")
        return
    except Exception as err:  # the handler is a boundary: whatever failed, the message is kept
        deliveries = msg.metadata.num_delivered if msg.metadata else 1
        keys = {"service": bus.service, "subject": msg.subject, "event": event_tag(event), "id": event.id,
                "deliveries": deliveries, "error": str(err) or repr(err)}
        if isinstance(err, BUGS):
            m.bugs.inc()
            log.exception("bug in a message handler; the message is kept for the fix", **keys)
        elif isinstance(err, Transient):
            m.retried.inc()
            log.warning("handler failed, will retry", **keys)
        else:
            m.retried.inc()
            log.exception("handler failed (not the message's fault), will retry", **keys)
        await _settle(msg.nak(delay=policy.delay(deliveries)), "nak")
        return
    finally:
        keeper.cancel()
    await _settle(msg.ack(), "ack")
    m.handled.inc()


async def _keep_in_progress(msg: Msg, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        with contextlib.suppress(*FAILURES):  # the next one may pass; an ack lost only redelivers
            await msg.in_progress()


async def _settle(ack: Any, what: str) -> None:
    """An ack lost with the connection is redelivered later: handlers are idempotent."""
    try:
        await ack
    except FAILURES as err:
        log.info("could not settle message (it will be redelivered)", what=what, error=repr(err))


# --- reading the stream ----------------------------------------------------------

async def last_seq(bus: Bus, domain: str = "") -> int:
    with failing(f"stream info {bus.settings.stream}"):
        info = await bus.client.jetstream(domain=domain or None).stream_info(bus.settings.stream)
    return int(info.state.last_seq)


async def read_after(bus: Bus, subject: str, after_seq: int, limit: int = 1000,
                     domain: str = "") -> list[StreamMessage]:  # fmt: skip
    """The stream's messages on ``subject`` (wildcards allowed) after ``after_seq``, in order
    (at most ``limit``), by direct gets: nothing is created on the server. ``domain``: the
    stream of that JetStream domain (a node's leaf server), not of the server connected to."""
    js, seq = bus.client.jetstream(domain=domain or None), after_seq + 1
    found: list[StreamMessage] = []
    while len(found) < limit:
        try:
            raw = await js.get_msg(bus.settings.stream, seq=seq, subject=subject, next=True, direct=True)
        except FAILURES as err:
            failure = classify(f"read {subject}", err)
            if isinstance(failure, NotFound):
                break
            raise failure from err
        stamp = getattr(raw, "time", None)
        stored = stamp.timestamp() if stamp is not None else 0.0
        found.append(StreamMessage(int(raw.seq or 0), str(raw.subject), bytes(raw.data or b""), stored))
        seq = found[-1].seq + 1
    return found
