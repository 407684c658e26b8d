"""A service's connection to NATS: connect, state, typed publish/subscribe, request/reply.

- ``connect()`` retries with backoff until a server answers, then lets nats-py
  reconnect forever; auth from :class:`NatsSettings` (user/password, a token or
  a token *file* re-read at every connect — projected service-account tokens
  rotate —, nkey, creds, TLS); several servers as a comma-separated URL list.
- Replies come back under the role's own inbox prefix (``layout.inbox``), so a
  permission can keep one service from reading another's replies.
- Listeners of :attr:`Bus.on_state` hear every disconnect and reconnect (a
  service's readiness follows the connection).
- Every failure leaves as :class:`~.errors.Transient` or :class:`~.errors.Permanent`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

# gpushare speaks NATS over TCP only. nats-py imports aiohttp for its websocket transport
# whenever it is installed (the kubernetes client depends on it), which costs every service
# about 16 MB of memory; nats-py handles its absence, so keep it out of our processes.
sys.modules.setdefault("aiohttp", None)  # type: ignore[arg-type]

import nats  # noqa: E402
from nats.aio.client import Client  # noqa: E402
from nats.aio.msg import Msg  # noqa: E402
from prometheus_client import CollectorRegistry, Counter  # noqa: E402

from ..events import AnyEvent, Event, EventDecodeError, decode, encode, event_tag  # noqa: E402
from ..layout import ROLES, Layout  # noqa: E402
from ..logging import get_logger  # noqa: E402
from ..retry import Backoff, retry, wait_any, wait_for_stop  # noqa: E402
from ..settings import NatsSettings  # noqa: E402
from ..subjects import INBOX, Subjects  # noqa: E402
from .errors import BUGS, FAILURES, BusError, Permanent, Transient, classify, failing  # noqa: E402
from .renewal import Renewal  # noqa: E402

log = get_logger("bus")

Handler = Callable[[AnyEvent], Awaitable[None]]
Responder = Callable[[AnyEvent], Awaitable[Event]]
RawHandler = Callable[[bytes, str], Awaitable[None]]
StateListener = Callable[[bool], None]


class BusMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        reg = registry or CollectorRegistry()
        self.messages = Counter("gpushare_bus_messages", "Messages handled by outcome", ["outcome"],
                                registry=reg)
        self.handled = self.messages.labels("handled")
        self.retried = self.messages.labels("retried")
        self.dropped = self.messages.labels("dropped")
        self.undecodable = self.messages.labels("undecodable")
        self.bugs = self.messages.labels("bug")  # a handler raised what a mistake in the code raises
        self.terminated = Counter("gpushare_bus_terminated", "JetStream messages terminated, by reason",
                                  ["reason"], registry=reg)
        self.published = Counter("gpushare_bus_published", "Messages published", registry=reg)
        self.reconnects = Counter("gpushare_bus_reconnects", "Reconnections to NATS", registry=reg)
        self.restored = Counter("gpushare_bus_consumer_restored",
                                "Durable consumers found changed behind their reader and made again", ["durable"],
                                registry=reg)


def _tls_context(settings: NatsSettings) -> ssl.SSLContext | None:
    if not (settings.tls_ca_file or settings.tls_cert_file):
        return None
    context = ssl.create_default_context(cafile=settings.tls_ca_file or None)
    if settings.tls_cert_file:
        context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file or None)
    return context


def _read_secret(path: str) -> str:
    """A password kept in a file ("" when unreadable: the server then refuses, and says so)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError as err:
        log.error("cannot read the NATS password file", path=path, error=str(err))
        return ""


def _read_token(path: str, presented: Callable[[str], None] = lambda _: None) -> Callable[[], str]:
    def token() -> str:
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read().strip()
        except OSError as err:
            log.error("cannot read the NATS token file", path=path, error=str(err))
            return ""
        presented(text)
        return text

    return token


# what nats-server answers a connection whose credentials it does not take
_REFUSED = ("authorization violation", "authentication expired", "authentication revoked")


def connect_options(settings: NatsSettings, inbox: str,
                    presented: Callable[[str], None] = lambda _: None) -> dict[str, Any]:  # fmt: skip
    options: dict[str, Any] = {
        "name": settings.name,
        "connect_timeout": settings.connect_timeout_s,
        "reconnect_time_wait": settings.reconnect_wait_s,
        "max_reconnect_attempts": -1,
        "allow_reconnect": True,
        "ping_interval": 5,
        "max_outstanding_pings": 3,
        "inbox_prefix": inbox,
    }
    if settings.user:
        options.update(user=settings.user, password=_read_secret(settings.password_file) if settings.password_file
                       else settings.password)  # fmt: skip
    if settings.token_file:
        options["token"] = _read_token(settings.token_file, presented)
    elif settings.token:
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
    """A service's connection to NATS. ``role``/``node`` name whose inbox its replies use."""

    def __init__(self, settings: NatsSettings, service: str, registry: CollectorRegistry | None = None,
                 node: str = "") -> None:  # fmt: skip
        self.settings = settings
        self.service = service
        self.node = node
        self.subjects = Subjects(settings.prefix)
        self.layout = Layout(settings.prefix, settings.stream, settings.kv_prefix)
        self.metrics = BusMetrics(registry)
        self.on_state: list[StateListener] = []
        self.connected = asyncio.Event()
        self._nc: Client | None = None
        self._closing = False
        self._denied: dict[str, float] = {}  # subject -> when the server refused it
        self.refused = ""  # why the server last refused this connection's credentials
        self.credentials_refused = asyncio.Event()  # set at each refusal (a connect keeps trying)
        self._renewal = Renewal(service)

    @property
    def inbox(self) -> str:
        return self.layout.inbox(self.service, self.node) if self.service in ROLES else INBOX

    # --- connection -----------------------------------------------------------

    async def connect(self, stop: asyncio.Event | None = None) -> None:
        """Connect, retrying with backoff until a server answers (or ``stop`` is set)."""
        servers = self.settings.servers()
        options = connect_options(self.settings, self.inbox, self._renewal.presented)

        async def attempt() -> Client:
            with failing(f"connect {self.settings.url}"):
                return await nats.connect(servers, error_cb=self._on_error, disconnected_cb=self._on_disconnect,
                                          reconnected_cb=self._on_reconnect,
                                          **options)  # fmt: skip

        self._nc = await retry(attempt, (Transient,), f"connect to NATS at {self.settings.url}", stop,
                               Backoff(0.1, 5.0), service=self.service)  # fmt: skip
        self._set_state(True)
        if self.settings.token_file:
            self._renewal.start(self._nc.force_reconnect)
        log.info("nats connected", service=self.service, url=self._nc.connected_url.netloc
                 if self._nc.connected_url else self.settings.url)  # fmt: skip

    def _set_state(self, up: bool) -> None:
        (self.connected.set if up else self.connected.clear)()
        for listener in self.on_state:
            listener(up)

    async def _on_error(self, err: Exception) -> None:
        text = str(err)
        if any(word in text.lower() for word in _REFUSED):
            self.refused = text.removeprefix("nats: ").strip("'")
            self.credentials_refused.set()
        if "permissions violation" in text.lower() and '"' in text:
            self._denied[text.split('"')[1].lower()] = time.monotonic()  # the server lowers it
            log.error("permission denied by the server", service=self.service, error=text)
            return
        log.warning("nats error", service=self.service, error=repr(err))

    def denied(self, within_s: float = 30.0) -> list[str]:
        """The subjects the server refused this connection lately (its permissions)."""
        now = time.monotonic()
        return sorted(s for s, at in self._denied.items() if now - at < within_s)

    def explaining(self, subject: str) -> Callable[[str, BaseException], BusError]:
        """:meth:`explain` for ``subject``, as :func:`~.errors.failing` takes it."""
        return lambda op, err: self.explain(op, subject, err)

    def explain(self, op: str, subject: str, err: BaseException) -> BusError:
        """:func:`classify`, except that a timeout on a subject the server just refused (it
        answers a denied publish only asynchronously) is :class:`Permanent`."""
        failure = classify(op, err)
        denied = self._denied.get(subject.lower())
        if isinstance(failure, Transient) and denied is not None and time.monotonic() - denied < 30:
            return Permanent(op, f"permission denied for {subject} (this service may not do that)")
        return failure

    async def _on_disconnect(self) -> None:
        self._set_state(False)
        if not self._closing:
            log.warning("nats disconnected", service=self.service)

    async def _on_reconnect(self) -> None:
        self.metrics.reconnects.inc()
        self._set_state(True)
        log.info("nats reconnected", service=self.service)

    @property
    def client(self) -> Client:
        """The nats-py client, for the other modules of this package only."""
        if self._nc is None:
            raise Permanent("use the bus", "not connected: call Bus.connect() first")
        return self._nc

    @property
    def is_connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    @property
    def reconnects(self) -> int:
        return int(self._nc.stats.get("reconnects", 0)) if self._nc is not None else 0

    async def wait_connected(self, stop: asyncio.Event | None = None, timeout: float | None = None) -> bool:
        """Wait until connected (True) or ``stop``/``timeout`` first (False)."""
        await wait_any(self.connected, *([stop] if stop is not None else []), timeout=timeout)
        return self.connected.is_set()

    async def drain(self) -> None:
        self._closing = True
        self._renewal.stop()
        if self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(*FAILURES):  # stopping: a connection already lost has nothing to drain
                await self._nc.drain()
        self.connected.clear()

    async def flush(self, timeout: int = 2) -> None:
        """Everything sent so far (a subscription included) has reached the server.

        nats-py writes the flush's PING straight to the socket while commands queued before it
        (a SUB) wait for its flusher task, so the server could answer PONG before it had the SUB
        and a request right after met "no responders". The flusher writes what is queued first.
        """
        with failing("flush"):
            # private, for the ordering nats-py lacks: wait until its flusher wrote the queue
            await asyncio.wait_for(self.client._flush_pending(force_flush=True), timeout)
            await self.client.flush(timeout)

    # --- core pub/sub ---------------------------------------------------------

    async def publish(self, subject: str, event: Event) -> None:
        await self.publish_bytes(subject, encode(event))

    async def publish_bytes(self, subject: str, payload: bytes) -> None:
        """Publish raw bytes (a tool feeding malformed input, a sandbox replay)."""
        with failing(f"publish {subject}", self.explaining(subject)):
            await self.client.publish(subject, payload)
        self.metrics.published.inc()

    async def publish_persistent(self, subject: str, event: Event) -> int:
        """Publish through JetStream (stored, de-duplicated by event id); the stream sequence."""
        with failing(f"publish {subject}", self.explaining(subject)):
            ack = await self.client.jetstream().publish(subject, encode(event), headers={"Nats-Msg-Id": event.id})
        self.metrics.published.inc()
        return int(ack.seq)

    async def publish_reliably(self, subject: str, event: Event, stop: asyncio.Event | None = None,
                               deadline_s: float | None = None) -> int:  # fmt: skip
        """:meth:`publish_persistent` until the stream acknowledged it, retrying what may pass
        (the stream's de-duplication makes a retry after a lost ack harmless)."""
        return await retry(lambda: self.publish_persistent(subject, event), (Transient,),
                           f"publish {event_tag(event)}", stop, Backoff(0.02, 1.0), deadline_s,
                           service=self.service, subject=subject, id=event.id)  # fmt: skip

    def decode(self, msg: Msg) -> AnyEvent | None:
        try:
            return decode(msg.data)
        except EventDecodeError as err:
            self.metrics.undecodable.inc()
            log.warning("dropped undecodable message", service=self.service, subject=msg.subject,
                        reason=err.reason)  # fmt: skip
            return None

    async def subscribe(self, subject: str, handler: Handler, queue: str = "") -> Subscription:
        """Core subscription: each decoded event goes to ``handler``; errors are logged and counted."""

        async def on_message(msg: Msg) -> None:
            event = self.decode(msg)
            if event is None:
                return
            try:
                await handler(event)
                self.metrics.handled.inc()
            except Exception as err:  # the handler is a boundary: nothing redelivers a core message
                self.failed(err, subject=msg.subject, event=event_tag(event), id=event.id)

        with failing(f"subscribe {subject}"):
            return Subscription(await self.client.subscribe(subject, queue=queue, cb=on_message))

    def failed(self, err: Exception, **keys: object) -> None:
        """A handler failed on a core message (called in its ``except``): counted and logged, a
        bug with its traceback."""
        if isinstance(err, BUGS):
            self.metrics.bugs.inc()
            log.exception("bug in a message handler", service=self.service, error=repr(err), **keys)
        else:
            self.metrics.dropped.inc()
            log.warning("handler failed; message dropped", service=self.service, error=str(err) or repr(err), **keys)

    async def subscribe_raw(self, subject: str, handler: RawHandler, queue: str = "") -> Subscription:
        """Core subscription to a protocol that is not gpushare's events (the NATS auth callout):
        ``handler(payload, reply subject)``; answer with :meth:`publish_bytes` to the reply subject."""

        async def on_message(msg: Msg) -> None:
            try:
                await handler(msg.data, msg.reply)
            except Exception as err:  # the handler is a boundary: nothing redelivers a core message
                self.failed(err, subject=msg.subject)

        with failing(f"subscribe {subject}"):
            return Subscription(await self.client.subscribe(subject, queue=queue, cb=on_message))

    # --- request/reply --------------------------------------------------------

    async def request(self, subject: str, event: Event, timeout: float = 2.0) -> AnyEvent:
        """The event answering ``event`` on ``subject``; Transient when nobody answers in time."""
        try:
            msg = await self.client.request(subject, encode(event), timeout=timeout)
        except FAILURES as err:
            failure = self.explain(f"request {subject}", subject, err)
            raise type(failure)(failure.op, f"{failure.reason}: is the serving service running?") from err
        reply = self.decode(msg)
        if reply is None:
            raise Permanent(f"request {subject}", "the reply does not decode")
        return reply

    async def _respond(self, msg: Msg, reply: Event) -> None:
        try:
            await msg.respond(encode(reply))
        except FAILURES as err:  # the connection went away: the caller times out as it would have
            log.info("could not answer a request", service=self.service, subject=msg.subject, error=repr(err))

    async def serve(self, subject: str, responder: Responder, queue: str = "",
                    invalid: Callable[[str], Event] | None = None) -> Subscription:
        """Answer typed requests on ``subject``; a responder error is logged and not answered. A
        request that does not decode is answered with ``invalid(reason)`` when given (the caller
        learns why at once instead of waiting out its timeout), else dropped and counted."""

        async def on_request(msg: Msg) -> None:
            try:
                event = decode(msg.data)
            except EventDecodeError as err:
                self.metrics.undecodable.inc()
                log.warning("undecodable request", service=self.service, subject=msg.subject, reason=err.reason,
                            answered=invalid is not None and bool(msg.reply))
                if invalid is not None and msg.reply:
                    await self._respond(msg, invalid(err.reason))
                return
            if not msg.reply:
                return
            try:
                reply = await responder(event)
                await msg.respond(encode(reply))
            except Exception as err:  # the responder is a boundary: the requester times out and retries
                self.failed(err, subject=msg.subject, event=event_tag(event), id=event.id)
                return
            self.metrics.handled.inc()

        with failing(f"subscribe {subject}"):
            return Subscription(await self.client.subscribe(subject, queue=queue, cb=on_request))


class Subscription:
    """A core subscription; ``unsubscribe()`` is safe twice."""

    def __init__(self, sub: Any) -> None:
        self._sub = sub

    async def unsubscribe(self) -> None:
        with contextlib.suppress(*FAILURES):  # gone already (twice, or with its connection)
            await self._sub.unsubscribe()


__all__ = ["Bus", "BusError", "BusMetrics", "Subscription", "wait_for_stop"]
