"""The link to the kernel module: register, keep registered, send commands, receive notices.

Lifecycle (one loop, :meth:`KernelLink.run`):

1. open the transport, send REGISTER (this socket becomes the receiver of
   notices), read STATS (the module's hold parameters, :attr:`KernelLink.timing`),
   then call ``on_registered`` (the service re-sends its watch set); only then
   is the link ``registered`` (ready)
2. read messages: replies complete the pending command of the same
   ``hdr.seq``; notices go, in order, to ``on_notice`` (from a task of their
   own, so a handler may send commands); malformed messages are counted and
   skipped. The module sends the notice of every reclaim in progress again
   right after the REGISTER reply;
3. every ``heartbeat_s`` ask STATS (a parameter written at run time is seen
   here): no reply within ``reply_timeout_s``, a send error, or a receiver
   port that is no longer ours (the module was reloaded and forgot us) ends
   the session;
4. close, wait (exponential backoff, reset after a good registration) and go
   back to 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gpushare_common.hold import HoldTiming
from gpushare_common.logging import get_logger
from gpushare_common.retry import Backoff, Supervised

from . import protocol
from .metrics import BridgeMetrics
from .transport import Transport, TransportError

log = get_logger("kmod-bridge.link")

NoticeHandler = Callable[[protocol.Notice, int], Awaitable[None]]
Hook = Callable[[], Awaitable[None]]
StateHook = Callable[[bool, str], None]


class KernelUnavailable(Exception):
    """The module is not registered right now (not loaded, reloading, or not answering)."""


class SessionLost(Exception):
    """The current registration is no longer valid; ``reason`` says why."""


@dataclass(frozen=True, slots=True)
class LinkSettings:
    reply_timeout_s: float = 2.0
    heartbeat_s: float = 2.0
    backoff_min_s: float = 0.05
    backoff_max_s: float = 5.0


class KernelLink:
    def __init__(self, transport: Transport, settings: LinkSettings, metrics: BridgeMetrics,
                 on_notice: NoticeHandler, on_registered: Hook | None = None,
                 on_state: StateHook | None = None) -> None:
        self.transport = transport
        self.settings = settings
        self.metrics = metrics
        self.on_notice = on_notice
        self.on_registered = on_registered
        self.on_state = on_state
        self.registered = asyncio.Event()
        self.registrations = 0
        self.last_stats: protocol.Reply | None = None
        self.timing = HoldTiming()  # the module's timeout_ms and max_hold_ms, from its last STATS or HOLD
        self.last_error = ""
        self._seq = 0
        self._pending: dict[int, asyncio.Future[protocol.Reply]] = {}
        self._lost: asyncio.Event = asyncio.Event()
        self._notices: asyncio.Queue[tuple[protocol.Notice, int]] = asyncio.Queue()
        self._open = asyncio.Event()  # REGISTER answered in this session: commands may go
        self._timed = asyncio.Event()  # the hold parameters read in this session: notices may go

    # --- commands ---------------------------------------------------------------

    async def request(self, cmd: int, ids: Sequence[int] = (), config: protocol.FilterConfig | None = None,
                      targets: Sequence[protocol.Target] = ()) -> protocol.Reply:
        """Send one command and wait for its reply; :class:`KernelUnavailable` when not registered."""
        if not self._open.is_set():
            raise KernelUnavailable(self.last_error or "not registered with the kernel module")
        seq = self._next_seq()
        return await self._exchange(seq, cmd, protocol.encode_command(cmd, seq, ids, config, targets))

    def _next_seq(self) -> int:
        self._seq = self._seq % 0xFFFFFFFF + 1
        return self._seq

    async def _exchange(self, seq: int, cmd: int, message: bytes) -> protocol.Reply:
        future: asyncio.Future[protocol.Reply] = asyncio.get_running_loop().create_future()
        self._pending[seq] = future
        try:
            await self.transport.send(message)
            return await asyncio.wait_for(future, self.settings.reply_timeout_s)
        except TransportError as err:
            self.metrics.errors.labels("send").inc()
            self._lose(f"send failed: {err}")
            raise KernelUnavailable(str(err)) from None
        except TimeoutError:
            self.metrics.errors.labels("no_reply").inc()
            self._lose(f"no reply to {protocol.COMMAND_NAMES.get(cmd, cmd)} within "
                       f"{self.settings.reply_timeout_s}s")
            raise KernelUnavailable(self.last_error) from None
        finally:
            self._pending.pop(seq, None)

    def _lose(self, reason: str) -> None:
        self.last_error = reason
        self._open.clear()
        self.registered.clear()
        self._lost.set()

    # --- session loop -------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Sessions with the module until ``stop``: one that registered starts the backoff again."""
        backoff = Backoff(self.settings.backoff_min_s, self.settings.backoff_max_s)
        async for session in Supervised("keep the kernel link", stop, backoff, transport=self.transport.name):
            before = self.registrations
            try:
                await self._session(stop)
            except (TransportError, SessionLost, KernelUnavailable) as err:
                self.last_error = str(err)
                session.failed(f"kernel link down: {err}")
            finally:
                self._end_session()
            if self.registrations > before:
                session.progress()
            if not session.failure and not stop.is_set():
                session.failed("the session ended")

    async def _session(self, stop: asyncio.Event) -> None:
        self._lost = asyncio.Event()
        self._open = asyncio.Event()
        self._timed = asyncio.Event()
        self._notices = asyncio.Queue()
        await self.transport.open()
        reader = asyncio.ensure_future(self._read())
        handler = asyncio.ensure_future(self._handle_notices())
        try:
            await self._register()
            heartbeat = asyncio.ensure_future(self._heartbeat())
            lost = asyncio.ensure_future(self._lost.wait())
            stopped = asyncio.ensure_future(stop.wait())
            waiters = [reader, handler, heartbeat, lost, stopped]
            try:
                done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters[2:]:
                    waiter.cancel()
            for task in (reader, handler):
                if task in done:
                    task.result()  # raises the transport's (or the handler's) error
            if lost in done:
                raise SessionLost(self.last_error)
        finally:
            for task in (reader, handler):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, TransportError):
                    await task

    async def _handle_notices(self) -> None:
        """Notices in order, once REGISTER is answered and the hold parameters are read (a
        handler may send commands, and holds the owner at the kernel's pace)."""
        await self._timed.wait()
        while True:
            notice, received_ns = await self._notices.get()
            await self.on_notice(notice, received_ns)

    async def _register(self) -> None:
        seq = self._next_seq()
        reply = await self._exchange(seq, protocol.CMD_REGISTER,
                                     protocol.encode_command(protocol.CMD_REGISTER, seq))
        if reply.header.status < 0:
            raise SessionLost(f"REGISTER refused with status {reply.header.status}")
        self._open.set()
        self._keep_stats(await self.request(protocol.CMD_STATS))  # the hold parameters, before any notice
        self._timed.set()
        if self.on_registered is not None:
            await self.on_registered()
        self.registrations += 1
        self.metrics.registrations.inc()
        self.last_error = ""
        self.registered.set()
        if self.on_state is not None:
            self.on_state(True, "")
        log.info("registered with the kernel module", transport=self.transport.name,
                 port=self.transport.port_id, registrations=self.registrations)

    def _end_session(self) -> None:
        self._open.clear()
        self.registered.clear()
        if self.on_state is not None:
            self.on_state(False, self.last_error or "not registered")
        self.transport.close()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(KernelUnavailable("kernel link closed"))
        self._pending.clear()

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            reply = await self.request(protocol.CMD_STATS)
            self._keep_stats(reply)
            head = reply.stats_head
            port = self.transport.port_id
            if head is not None and (head.receiver_portid == 0 or (port and head.receiver_portid != port)):
                self.metrics.errors.labels("reloaded").inc()
                self._lose(f"receiver is port {head.receiver_portid}, not ours ({port}): module reloaded")
                return

    def _keep_stats(self, reply: protocol.Reply) -> None:
        self.last_stats = reply
        self.note_timing(reply)

    def note_timing(self, reply: protocol.Reply) -> None:
        """The hold parameters of a reply with a stats head (STATS, HOLD) become :attr:`timing`."""
        head = reply.stats_head
        if head is None:
            return
        timing = self.timing.updated(head.timeout_ms, head.max_hold_ms)
        if timing != self.timing:
            log.info("kernel hold parameters", transport=self.transport.name, timeout_ms=timing.timeout_ms,
                     max_hold_ms=timing.max_hold_ms)
            self.timing = timing

    # --- receiving -----------------------------------------------------------------

    async def _read(self) -> None:
        while True:
            data = await self.transport.receive()
            received_ns = time.monotonic_ns()
            try:
                frames = list(protocol.split_frames(data))
            except protocol.ProtocolError as err:
                self._malformed(err)
                continue
            for frame in frames:
                await self._dispatch(frame, received_ns)

    async def _dispatch(self, frame: protocol.Frame, received_ns: int) -> None:
        try:
            if frame.nl_type == protocol.MSG_NOTICE:
                notice = protocol.decode_notice(frame)
            elif frame.nl_type == protocol.MSG_REPLY:
                self._complete(protocol.decode_reply(frame))
                return
            else:
                raise protocol.ProtocolError(f"unexpected nlmsg_type {frame.nl_type:#x}")
        except protocol.ProtocolError as err:
            self._malformed(err)
            return
        self.metrics.notices.inc()
        self._notices.put_nowait((notice, received_ns))

    def _complete(self, reply: protocol.Reply) -> None:
        future = self._pending.get(reply.header.seq)
        if future is None or future.done():
            self.metrics.errors.labels("unexpected_reply").inc()
            return
        future.set_result(reply)

    def _malformed(self, err: protocol.ProtocolError) -> None:
        self.metrics.malformed.inc()
        log.warning("skipped malformed kernel message", transport=self.transport.name,
                    reason=err.reason)
