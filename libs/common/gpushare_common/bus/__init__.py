"""The one NATS wrapper. Nothing of nats-py or msgspec leaves this package: services see
:class:`Bus`, :class:`Store`, :class:`AckPolicy`, :class:`StreamMessage` and the errors
:class:`BusError` > :class:`Transient` | :class:`Permanent` (> :class:`NotFound`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from .connection import Bus as _Connection
from .connection import Handler, RawHandler, Responder, Subscription
from .errors import BUGS, BusError, NotFound, Permanent, Transient
from .jetstream import AckPolicy, StreamMessage, consume, ensure_layout, last_seq, read_after, wait_for_stream
from .kv import Store, escape_key, unescape_key
from .watch import KeyChanges, watch_bucket


class Bus(_Connection):
    """A service's connection to NATS, with the event stream and its buckets."""

    async def ensure_layout(self, node: str = "") -> None:
        """Create or update the stream and every bucket (the installer; tests): of one node on
        its leaf server, or of every node."""
        await ensure_layout(self, node)

    async def wait_for_stream(self, stop: asyncio.Event | None = None) -> None:
        await wait_for_stream(self, stop)

    async def consume(self, subject: str, durable: str, handler: Handler, policy: AckPolicy,
                      stop: asyncio.Event, batch: int = 16) -> None:  # fmt: skip
        await consume(self, subject, durable, handler, policy, stop, batch)

    async def store(self, bucket: str, scope: str) -> Store:
        """``bucket`` (a name of :data:`~gpushare_common.layout.BUCKETS`) seen through ``scope``.

        Bound without asking the server (no ``STREAM.INFO``, which node roles may not send): the
        installer made every bucket with direct gets, and :meth:`wait_for_stream` came first."""
        name = self.layout.bucket(bucket)
        return Store.bound(self.client.jetstream(), name, scope, self.explain,
                           self.layout.scan_consumer(self.service, scope))

    async def last_seq(self, domain: str = "") -> int:
        return await last_seq(self, domain)

    async def read_after(self, subject: str, after_seq: int, limit: int = 1000,
                         domain: str = "") -> list[StreamMessage]:  # fmt: skip
        """The stream's messages after ``after_seq`` (``domain``: a node's leaf server's stream)."""
        return await read_after(self, subject, after_seq, limit, domain)

    def watch_bucket(self, bucket: str, keys: str, stop: asyncio.Event, heartbeat_s: float = 2.0,
                     domain: str = "") -> AsyncIterator[KeyChanges]:  # fmt: skip
        """Every key of ``bucket`` matching ``keys``, then each change (:mod:`.watch`), through the
        observer's own consumer (``observer-<node>``: this connection's instance); ``domain``: the
        bucket of that JetStream domain (a node's leaf server)."""
        return watch_bucket(self, bucket, keys, stop, heartbeat_s, domain, self.layout.observer_consumer(self.node))


__all__ = ["BUGS", "AckPolicy", "Bus", "BusError", "Handler", "NotFound", "Permanent", "RawHandler", "Responder",
           "Store", "StreamMessage", "Subscription", "Transient", "escape_key", "unescape_key"]
