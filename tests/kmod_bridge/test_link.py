"""The kernel link against the kernel stand-in: register, commands, notices, reload, bad bytes."""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import AsyncIterator

import pytest
from gpushare_kmod_bridge import protocol
from gpushare_kmod_bridge.adapters.simsocket import SimTransport
from gpushare_kmod_bridge.link import KernelLink, KernelUnavailable, LinkSettings
from gpushare_kmod_bridge.metrics import BridgeMetrics
from gpushare_kmod_bridge.transport import TransportError
from gpushare_sim.kernel import KernelStandIn

from .conftest import Namespaces, PidnsProcess, ioctl, wait_until

FAST = LinkSettings(reply_timeout_s=0.5, heartbeat_s=0.05, backoff_min_s=0.01, backoff_max_s=0.05)


class Recorder:
    def __init__(self) -> None:
        self.notices: asyncio.Queue[protocol.Notice] = asyncio.Queue()
        self.registered = 0

    async def on_notice(self, notice: protocol.Notice, received_ns: int) -> None:
        self.notices.put_nowait(notice)

    async def on_registered(self) -> None:
        self.registered += 1


@contextlib.asynccontextmanager
async def running(link: KernelLink) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    task = asyncio.create_task(link.run(stop))
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


def make_link(path: str, recorder: Recorder, metrics: BridgeMetrics | None = None) -> KernelLink:
    return KernelLink(SimTransport(path), FAST, metrics or BridgeMetrics(), recorder.on_notice,
                      recorder.on_registered)


async def test_detect_notice_hold_release(kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    recorder = Recorder()
    link = make_link(kernel.socket_path, recorder)
    pidns = pidns_process.pidns
    async with running(link):
        await asyncio.wait_for(link.registered.wait(), 5)
        assert (await link.request(protocol.CMD_DETECT, targets=[pidns_process.target])).statuses == (0,)
        call = asyncio.create_task(ioctl(kernel.hook_path, pidns, pid=55))
        notice = await asyncio.wait_for(recorder.notices.get(), 5)
        assert (notice.pidns, notice.pid, notice.resent) == (pidns, 55, False)
        assert not call.done()
        hold = await link.request(protocol.CMD_HOLD, [pidns])
        (held,) = hold.stats
        assert hold.header.status == 1 and held.holds == 1 and held.flags & protocol.F_RECLAIMING
        assert hold.stats_head is not None and held.deadline_ns > hold.stats_head.now_ns
        reply = await link.request(protocol.CMD_RELEASE, [pidns])
        assert reply.header.status == 1  # one task woken
        assert await asyncio.wait_for(call, 5) < 3000
        stats = await link.request(protocol.CMD_STATS, [pidns])
        (record,) = stats.stats
        assert (record.hits, record.notices, record.releases, record.flags, record.deadline_ns) == \
            (1, 1, 1, protocol.F_WATCHED, 0)


async def test_kernel_status_is_passed_back(kernel: KernelStandIn, namespaces: Namespaces) -> None:
    kernel.state.max_entries = 1
    link = make_link(kernel.socket_path, Recorder())
    first, second = namespaces.new(), namespaces.new()
    async with running(link):
        await asyncio.wait_for(link.registered.wait(), 5)
        assert (await link.request(protocol.CMD_ADD, targets=[first.target])).header.status == 0
        full = await link.request(protocol.CMD_ADD, targets=[first.target, second.target])
        assert (full.header.status, full.statuses) == (-errno.ENOSPC, (0, -errno.ENOSPC))
        config = await link.request(protocol.CMD_CONFIG, config=protocol.FilterConfig((0x46, 0x41), (195,)))
        assert config.config == protocol.FilterConfig((0x46, 0x41), (195,))


async def test_reregisters_after_the_module_goes_away(kernel: KernelStandIn) -> None:
    recorder = Recorder()
    link = make_link(kernel.socket_path, recorder)
    async with running(link):
        await wait_until(lambda: recorder.registered == 1, what="first registration")
        await kernel.close()  # module unloaded: the socket is gone
        await wait_until(lambda: not link.registered.is_set(), what="link down")
        with pytest.raises(KernelUnavailable):
            await link.request(protocol.CMD_DELETE, [5])
        await kernel.start()  # loaded again
        await wait_until(lambda: recorder.registered == 2, what="second registration")
        assert kernel.receiver is not None


async def test_notices_after_reregistration_reach_the_new_receiver(
        kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    recorder = Recorder()
    link = make_link(kernel.socket_path, recorder)
    pidns = pidns_process.pidns
    async with running(link):
        await wait_until(lambda: recorder.registered == 1, what="registration")
        kernel.receiver = None  # the module forgot its receiver (reloaded under the same socket)
        await wait_until(lambda: recorder.registered == 2, what="re-registration after heartbeat")
        await link.request(protocol.CMD_DETECT, targets=[pidns_process.target])
        hit = asyncio.create_task(ioctl(kernel.hook_path, pidns))
        assert (await asyncio.wait_for(recorder.notices.get(), 5)).pidns == pidns
        await link.request(protocol.CMD_RELEASE, [pidns])
        await hit


async def test_a_notice_missed_while_away_comes_with_the_next_registration(
        kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    """The bridge is away at the hit; when it registers again the kernel sends the notice again,
    and a handler may send commands (here RELEASE) while the link is still reading."""
    recorder = Recorder()
    pidns = pidns_process.pidns
    link = make_link(kernel.socket_path, recorder)
    async with running(link) as stop:
        await asyncio.wait_for(link.registered.wait(), 5)
        await link.request(protocol.CMD_DETECT, targets=[pidns_process.target])
        stop.set()
    await wait_until(lambda: kernel.receiver is None, what="the receiver gone")
    hit = asyncio.create_task(ioctl(kernel.hook_path, pidns, pid=pidns_process.pid))
    await wait_until(lambda: kernel.state.entries[pidns].blocked == 1, what="the owner blocked")
    released: list[int] = []

    async def release(notice: protocol.Notice, received_ns: int) -> None:
        recorder.notices.put_nowait(notice)
        released.append((await link.request(protocol.CMD_RELEASE, [notice.pidns])).header.status)

    link = KernelLink(SimTransport(kernel.socket_path), FAST, BridgeMetrics(), release)
    async with running(link):
        notice = await asyncio.wait_for(recorder.notices.get(), 5)
        assert (notice.pidns, notice.pid, notice.resent) == (pidns, pidns_process.pid, True)
        assert await asyncio.wait_for(hit, 5) < 3000
        await wait_until(lambda: released == [1], what="the release sent by the notice handler")


class ScriptedTransport:
    """Hands out prepared datagrams, then answers REGISTER and STATS like a kernel."""

    name = "scripted"

    def __init__(self, incoming: list[bytes]) -> None:
        self.incoming = incoming
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()

    @property
    def port_id(self) -> int:
        return 0

    async def open(self) -> None:
        pass

    async def send(self, data: bytes) -> None:
        (frame,) = protocol.split_frames(data)
        header, _ = protocol.decode_header(frame)
        if header.cmd == protocol.CMD_REGISTER:
            for item in self.incoming:
                self.queue.put_nowait(item)
        head = protocol.StatsHead(0, 0, 0, 0, 1, 77, 1) if header.cmd == protocol.CMD_STATS else None
        reply = protocol.Reply(protocol.Header(header.cmd, header.seq), head)
        self.queue.put_nowait(protocol.encode_reply(reply))

    async def receive(self) -> bytes:
        return await self.queue.get()

    def close(self) -> None:
        pass


async def test_malformed_messages_are_counted_and_skipped() -> None:
    good = protocol.encode_notice(protocol.Notice(42, 1, 2, 2, 0x4600, 1))
    bad = [
        b"\x00\x01",  # shorter than nlmsghdr
        protocol.encode_frame(protocol.MSG_NOTICE, 1, protocol.Header(9, 1, count=1), b"\x00" * 8),
        protocol.encode_frame(protocol.MSG_NOTICE, 1, protocol.Header(9, 1, count=1, version=7), bytes(32)),
        protocol.encode_frame(0x55, 1, protocol.Header(1, 1), b""),
    ]
    recorder, metrics = Recorder(), BridgeMetrics()
    link = KernelLink(ScriptedTransport([*bad, good]), FAST, metrics, recorder.on_notice)
    async with running(link):
        assert (await asyncio.wait_for(recorder.notices.get(), 5)).pidns == 42
    assert metrics.malformed._value.get() == len(bad)
    assert link.registrations == 1


async def test_unreachable_kernel_backs_off_and_reports(sock_dir) -> None:  # type: ignore[no-untyped-def]
    states: list[tuple[bool, str]] = []
    link = KernelLink(SimTransport(str(sock_dir / "absent.sock")), FAST, BridgeMetrics(),
                      Recorder().on_notice, on_state=lambda ok, why: states.append((ok, why)))
    async with running(link):
        await wait_until(lambda: len(states) >= 3, what="several failed attempts")
    assert not any(ok for ok, _ in states)
    assert "absent.sock" in states[0][1]
    with pytest.raises(TransportError):
        await SimTransport(str(sock_dir / "absent.sock")).open()
