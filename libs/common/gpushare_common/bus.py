"""The one NATS wrapper: typed publish/subscribe/request, JetStream stream and consumers, KV.

- ``connect()`` retries forever with backoff until the server answers, then
  lets nats-py reconnect forever; auth from :class:`NatsSettings`.
- Typed core publish/subscribe and request/reply of :mod:`events`.
- JetStream: the ``GPUSHARE`` stream (bounded by age and bytes) over the
  prefix; durable pull consumers with an explicit, declared :class:`AckPolicy`.
- A message that does not decode is logged with its subject and reason,
  counted, terminated (never redelivered forever), and the subscriber goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

# gpushare speaks NATS over TCP only. nats-py imports aiohttp for its websocket transport
# whenever it is installed (the kubernetes client depends on it), which costs every service
# about 16 MB of memory; nats-py handles its absence, so keep it out of our processes.
sys.modules.setdefault("aiohttp", None)  # type: ignore[arg-type]

import nats  # noqa: E402
from nats.aio.client import Client  # noqa: E402
from nats.aio.msg import Msg  # noqa: E402
from nats.aio.subscription import Subscription  # noqa: E402
from nats.js import api  # noqa: E402
from nats.js.client import JetStreamContext  # noqa: E402
from nats.js.errors import NotFoundError  # noqa: E402
from prometheus_client import CollectorRegistry, Counter  # noqa: E402

from .events import AnyEvent, Event, EventDecodeError, decode, encode, event_tag  # noqa: E402
from .kvstore import Store  # noqa: E402
from .logging import get_logger  # noqa: E402
from .settings import NatsSettings  # noqa: E402
from .subjects import Subjects  # noqa: E402

log = get_logger("bus")

Handler = Callable[[AnyEvent], Awaitable[None]]
Responder = Callable[[AnyEvent], Awaitable[Event]]


class Retryable(Exception):
    """Raised by a handler: the message should be delivered again (nak)."""


class BusError(Exception):
    """A NATS operation failed; the message says which and what to check."""


@dataclass(frozen=True, slots=True)
class AckPolicy:
    """How a JetStream handler's outcome maps to acks.

    Return normally -> ack. An exception in ``retry_on`` -> nak with ``retry_delay_s``
    until ``max_deliver`` deliveries, then terminate and count. Any other exception ->
    terminate and count at once (it would fail again the same way).
    """

    max_deliver: int = 5
    retry_on: tuple[type[BaseException], ...] = (Retryable,)
    retry_delay_s: float = 0.2
    ack_wait_s: float = 30.0


class BusMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        reg = registry or CollectorRegistry()
        self.messages = Counter(
            "gpushare_bus_messages", "Messages handled by outcome", ["outcome"], registry=reg
        )
        self.handled = self.messages.labels("handled")
        self.retried = self.messages.labels("retried")
        self.dropped = self.messages.labels("dropped")
        self.undecodable = self.messages.labels("undecodable")
        self.published = Counter("gpushare_bus_published", "Messages published", registry=reg)


def _tls_context(settings: NatsSettings) -> ssl.SSLContext | None:
    if not (settings.tls_ca_file or settings.tls_cert_file):
        return None
    context = ssl.create_default_context(cafile=settings.tls_ca_file or None)
    if settings.tls_cert_file:
        context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file or None)
    return context


def connect_options(settings: NatsSettings) -> dict[str, Any]:
    options: dict[str, Any] = {
        "name": settings.name,
        "connect_timeout": settings.connect_timeout_s,
        "reconnect_time_wait": settings.reconnect_wait_s,
        "max_reconnect_attempts": -1,
        "allow_reconnect": True,
        "ping_interval": 5,
        "max_outstanding_pings": 3,
    }
    if settings.user:
        options.update(user=settings.user, password=settings.password)
    if settings.token:
        options["token"] = settings.token
    if settings.nkey_seed_file:
        options["nkeys_seed"] = settings.nkey_seed_file
    if settings.creds_file:
        options["user_credentials"] = settings.creds_file
    tls = _tls_context(settings)
    if tls is not None:
        options["tls"] = tls
    return options


class Bus:
    """A service's connection to NATS."""

    def __init__(
        self, settings: NatsSettings, service: str, registry: CollectorRegistry | None = None
    ) -> None:
        self.settings = settings
        self.service = service
        self.subjects = Subjects(settings.prefix)
        self.metrics = BusMetrics(registry)
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self.connected = asyncio.Event()
        self._closing = False

    # --- connection -----------------------------------------------------------

    async def connect(self, stop: asyncio.Event | None = None) -> None:
        """Connect, retrying with backoff until it works (or ``stop`` is set)."""
        delay = 0.1
        while True:
            try:
                self._nc = await nats.connect(
                    self.settings.servers(),
                    error_cb=self._on_error,
                    disconnected_cb=self._on_disconnect,
                    reconnected_cb=self._on_reconnect,
                    **connect_options(self.settings),
                )
                break
            except Exception as err:  # nats-py raises several unrelated types here
                log.warning("nats connect failed, retrying", url=self.settings.url,
                            error=repr(err), retry_in_s=round(delay, 2))
                if stop is not None and stop.is_set():
                    raise BusError(f"cannot connect to NATS at {self.settings.url}") from err
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        self._js = self._nc.jetstream()
        self.connected.set()
        log.info("nats connected", service=self.service, url=self.settings.url)

    async def _on_error(self, err: Exception) -> None:
        log.warning("nats error", service=self.service, error=repr(err))

    async def _on_disconnect(self) -> None:
        self.connected.clear()
        if not self._closing:
            log.warning("nats disconnected", service=self.service)

    async def _on_reconnect(self) -> None:
        self.connected.set()
        log.info("nats reconnected", service=self.service)

    @property
    def nc(self) -> Client:
        if self._nc is None:
            raise BusError("not connected: call Bus.connect() first")
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise BusError("not connected: call Bus.connect() first")
        return self._js

    @property
    def is_connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    async def drain(self) -> None:
        self._closing = True
        if self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(Exception):
                await self._nc.drain()
        self.connected.clear()

    # --- core pub/sub ---------------------------------------------------------

    async def publish(self, subject: str, event: Event) -> None:
        await self.nc.publish(subject, encode(event))
        self.metrics.published.inc()

    async def publish_persistent(self, subject: str, event: Event) -> int:
        """Publish through JetStream (stored, de-duplicated by event id); returns the sequence."""
        ack = await self.js.publish(subject, encode(event), headers={"Nats-Msg-Id": event.id})
        self.metrics.published.inc()
        return int(ack.seq)

    def _decode(self, msg: Msg) -> AnyEvent | None:
        try:
            return decode(msg.data)
        except EventDecodeError as err:
            self.metrics.undecodable.inc()
            log.warning("dropped undecodable message", service=self.service,
                        subject=msg.subject, reason=err.reason)
            return None

    async def subscribe(self, subject: str, handler: Handler, queue: str = "") -> Subscription:
        """Core subscription: each decoded event goes to ``handler``; errors are logged and counted."""

        async def on_message(msg: Msg) -> None:
            event = self._decode(msg)
            if event is None:
                return
            try:
                await handler(event)
                self.metrics.handled.inc()
            except Exception:
                self.metrics.dropped.inc()
                log.exception("handler failed", service=self.service, subject=msg.subject,
                              event=event_tag(event), id=event.id)

        return await self.nc.subscribe(subject, queue=queue, cb=on_message)

    # --- request/reply --------------------------------------------------------

    async def request(self, subject: str, event: Event, timeout: float = 2.0) -> AnyEvent:
        """The first event answering ``event`` on ``subject``.

        The stream captures every subject under the prefix, so JetStream also
        answers a request with its publish ack: that reply is skipped.
        """
        replies: asyncio.Queue[Msg] = asyncio.Queue()

        async def on_reply(msg: Msg) -> None:
            replies.put_nowait(msg)

        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox, cb=on_reply)
        try:
            await self.nc.publish(subject, encode(event), reply=inbox)
            return await self._first_event(subject, replies, timeout)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _first_event(self, subject: str, replies: asyncio.Queue[Msg], timeout: float) -> AnyEvent:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            left = deadline - asyncio.get_running_loop().time()
            try:
                msg = await asyncio.wait_for(replies.get(), max(left, 0.0))
            except TimeoutError:
                raise BusError(f"no reply on {subject} within {timeout}s: "
                               "is the serving service running?") from None
            if (msg.headers or {}).get("Status") == "503":
                raise BusError(f"no reply on {subject} (no responders): is the serving service running?")
            if _is_stream_ack(msg.data):
                continue
            reply = self._decode(msg)
            if reply is None:
                raise BusError(f"undecodable reply on {subject}")
            return reply

    async def serve(self, subject: str, responder: Responder, queue: str = "") -> Subscription:
        """Answer typed requests on ``subject``; a responder error is logged and not answered."""

        async def on_request(msg: Msg) -> None:
            event = self._decode(msg)
            if event is None or not msg.reply:
                return
            try:
                reply = await responder(event)
            except Exception:
                self.metrics.dropped.inc()
                log.exception("request handler failed", service=self.service, subject=msg.subject)
                return
            await msg.respond(encode(reply))
            self.metrics.handled.inc()

        return await self.nc.subscribe(subject, queue=queue, cb=on_request)

    # --- JetStream ------------------------------------------------------------

    async def ensure_stream(self) -> None:
        """Create or update the stream capturing every subject under the prefix."""
        config = api.StreamConfig(
            name=self.settings.stream,
            subjects=[self.subjects.all()],
            max_age=self.settings.stream_max_age_s,
            max_bytes=self.settings.stream_max_bytes,
            storage=api.StorageType.FILE,
            num_replicas=self.settings.stream_replicas,
            duplicate_window=120.0,
        )
        try:
            await self.js.stream_info(self.settings.stream)
            await self.js.update_stream(config)
        except NotFoundError:
            await self.js.add_stream(config)

    async def consume(
        self,
        subject: str,
        durable: str,
        handler: Handler,
        policy: AckPolicy,
        stop: asyncio.Event,
        batch: int = 256,
    ) -> None:
        """Run a durable pull consumer until ``stop``; survives server restarts."""
        sub: Any = None
        try:
            while not stop.is_set():
                try:
                    if sub is None:
                        sub = await self._pull_subscribe(subject, durable, policy)
                    msgs = await sub.fetch(batch, timeout=0.5)
                except (TimeoutError, nats.errors.TimeoutError):
                    continue
                except Exception as err:
                    log.warning("consumer fetch failed, retrying", service=self.service,
                                durable=durable, error=repr(err))
                    sub = None
                    await _sleep_or_stop(stop, 0.5)
                    continue
                for msg in msgs:
                    await self._handle_js(msg, handler, policy)
        finally:
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def _pull_subscribe(self, subject: str, durable: str, policy: AckPolicy) -> Any:
        config = api.ConsumerConfig(
            ack_policy=api.AckPolicy.EXPLICIT,
            max_deliver=policy.max_deliver,
            ack_wait=policy.ack_wait_s,
            deliver_policy=api.DeliverPolicy.ALL,
            filter_subject=subject,
        )
        return await self.js.pull_subscribe(
            subject, durable=durable, stream=self.settings.stream, config=config
        )

    async def _handle_js(self, msg: Msg, handler: Handler, policy: AckPolicy) -> None:
        event = self._decode(msg)
        if event is None:
            await msg.term()
            return
        try:
            await handler(event)
        except policy.retry_on as err:
            delivered = msg.metadata.num_delivered if msg.metadata else policy.max_deliver
            if delivered >= policy.max_deliver:
                self.metrics.dropped.inc()
                log.error("giving up on message", service=self.service, subject=msg.subject,
                          event=event_tag(event), id=event.id, deliveries=delivered, error=repr(err))
                await msg.term()
            else:
                self.metrics.retried.inc()
                await msg.nak(delay=policy.retry_delay_s)
            return
        except Exception:
            self.metrics.dropped.inc()
            log.exception("handler failed, message dropped", service=self.service,
                          subject=msg.subject, event=event_tag(event), id=event.id)
            await msg.term()
            return
        await msg.ack()
        self.metrics.handled.inc()

    # --- key-value ------------------------------------------------------------

    async def store(self, name: str, history: int = 1) -> Store:
        """A KV bucket ``<kv_prefix>-<name>`` (created if missing), wrapped as a :class:`Store`."""
        bucket = f"{self.settings.kv_prefix}-{name}"
        try:
            kv = await self.js.key_value(bucket)
        except (NotFoundError, nats.js.errors.BucketNotFoundError):
            kv = await self.js.create_key_value(
                api.KeyValueConfig(bucket=bucket, history=history, storage=api.StorageType.FILE)
            )
        return Store(kv, bucket)


def _is_stream_ack(data: bytes) -> bool:
    """A JetStream publish ack (``{"stream": ..., "seq": ...}``), not an event."""
    return data.startswith(b'{"stream"') and b'"type"' not in data


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
