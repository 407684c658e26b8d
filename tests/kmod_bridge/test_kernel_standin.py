"""The kernel stand-in (sim/gpushare_sim/kernel.py) behaves as the module's header says."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from gpushare_kmod_bridge import protocol
from gpushare_sim.kernel import KernelStandIn

from .conftest import Namespaces, PidnsProcess, dead_pid, ioctl, wait_until


class RawClient:
    """A netlink port of the stand-in, speaking bytes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, path: str) -> RawClient:
        return cls(*await asyncio.open_unix_connection(path))

    async def send(self, data: bytes) -> protocol.Frame:
        self.writer.write(data)
        await self.writer.drain()
        return await self.next()

    async def next(self) -> protocol.Frame:
        head = await asyncio.wait_for(self.reader.readexactly(16), 5)
        rest = await self.reader.readexactly(((struct.unpack_from("<I", head)[0] + 3) & ~3) - 16)
        (frame,) = protocol.split_frames(head + rest)
        return frame

    async def status(self, cmd: int, ids: list[int] = ()) -> int:  # type: ignore[assignment]
        return (await self.reply(cmd, ids)).header.status

    async def reply(self, cmd: int, ids: list[int] = (),  # type: ignore[assignment]
                    targets: list[protocol.Target] = ()) -> protocol.Reply:  # type: ignore[assignment]
        return protocol.decode_reply(await self.send(protocol.encode_command(cmd, 1, ids, targets=targets)))

    async def watch(self, cmd: int, *processes: PidnsProcess) -> int:
        """ADD or DETECT of these processes' namespaces: the reply's status."""
        return (await self.reply(cmd, targets=[p.target for p in processes])).header.status

    def close(self) -> None:
        self.writer.close()


def raw_command(cmd: int, count: int, items: bytes, version: int = 2, nl_type: int = protocol.MSG_CMD) -> bytes:
    return protocol.encode_frame(nl_type, 3, protocol.Header(cmd, 3, count=count, version=version), items)


def target(pidns: int, pid: int = 1, pad: int = 0) -> bytes:
    return struct.pack("<QII", pidns, pid, pad)


@pytest.mark.parametrize(("data", "status"), [
    (raw_command(protocol.CMD_ADD, 1, target(5), version=1), -errno.EPROTO),
    (raw_command(42, 0, b""), -errno.EOPNOTSUPP),
    (raw_command(protocol.CMD_NOTICE, 0, b""), -errno.EOPNOTSUPP),
    (raw_command(protocol.CMD_ADD, 2, target(5)), -errno.EINVAL),  # truncated
    (raw_command(protocol.CMD_ADD, 1, target(5) + target(6)), -errno.EINVAL),  # longer
    (raw_command(protocol.CMD_ADD, 1, struct.pack("<Q", 5)), -errno.EINVAL),  # a bare id (version 1)
    (raw_command(protocol.CMD_ADD, 1, target(0)), -errno.EINVAL),  # id 0
    (raw_command(protocol.CMD_ADD, 1, target(2**32)), -errno.EINVAL),  # above U32_MAX
    (raw_command(protocol.CMD_DETECT, 1, target(5, pid=0)), -errno.EINVAL),  # pid 0
    (raw_command(protocol.CMD_DETECT, 1, target(5, pad=7)), -errno.EINVAL),  # pad not zero
    (raw_command(protocol.CMD_ADD, 1025, bytes(16 * 1025)), -errno.EINVAL),  # oversize
    (raw_command(protocol.CMD_HOLD, 1, target(5)), -errno.EINVAL),  # HOLD takes bare ids
    (raw_command(protocol.CMD_REGISTER, 1, struct.pack("<Q", 5)), -errno.EINVAL),
    (raw_command(protocol.CMD_ADD, 1, target(5), nl_type=protocol.MSG_REPLY), -errno.EINVAL),
])
async def test_malformed_commands_get_the_modules_errors(kernel: KernelStandIn, data: bytes, status: int) -> None:
    client = await RawClient.connect(kernel.socket_path)
    try:
        reply = protocol.decode_reply(await client.send(data))
        assert reply.header.status == status
        assert kernel.state.entries == {}
    finally:
        client.close()


async def test_hit_without_detect_passes_and_counts(kernel: KernelStandIn, namespaces: Namespaces) -> None:
    client = await RawClient.connect(kernel.socket_path)
    owner, other = namespaces.new(), namespaces.new()
    try:
        assert await client.watch(protocol.CMD_ADD, owner) == 0
        assert await ioctl(kernel.hook_path, owner.pidns) < 100
        assert await ioctl(kernel.hook_path, other.pidns) == 0  # not mapped
        assert await ioctl(kernel.hook_path, owner.pidns, ioctl_type=0x41) == 0  # not a watched type
        entry = kernel.state.entries[owner.pidns]
        assert entry.hits == 1 and entry.notices == 0
    finally:
        client.close()


async def test_timeout_ends_the_wait_and_is_counted(kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    kernel.state.timeout_ms = 150
    client = await RawClient.connect(kernel.socket_path)
    pidns = pidns_process.pidns
    try:
        assert await client.status(protocol.CMD_REGISTER) == 0
        assert await client.watch(protocol.CMD_DETECT, pidns_process) == 0
        held = await ioctl(kernel.hook_path, pidns, pid=9)
        notice = protocol.decode_notice(await client.next())
        assert (notice.pidns, notice.pid, notice.seq, notice.flags) == (pidns, 9, 1, 0)
        assert 140 <= held < 1000
        entry = kernel.state.entries[pidns]
        assert (entry.timeouts, entry.releases, entry.reclaiming, entry.need_notice) == (1, 0, False, False)
        assert await ioctl(kernel.hook_path, pidns) < 100  # one notice per detect
    finally:
        client.close()


async def test_other_callers_wait_on_the_same_release(kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    client = await RawClient.connect(kernel.socket_path)
    pidns = pidns_process.pidns
    try:
        await client.status(protocol.CMD_REGISTER)
        await client.watch(protocol.CMD_DETECT, pidns_process)
        first = asyncio.create_task(ioctl(kernel.hook_path, pidns, pid=1))
        await client.next()  # the notice
        second = asyncio.create_task(ioctl(kernel.hook_path, pidns, pid=2))
        await wait_until(lambda: kernel.state.entries[pidns].blocked == 2, what="two blocked callers")
        assert kernel.sent == 1
        assert await client.status(protocol.CMD_RELEASE, [pidns]) == 2
        await asyncio.wait_for(asyncio.gather(first, second), 5)
    finally:
        client.close()


async def test_delete_wakes_and_forgets(kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    client = await RawClient.connect(kernel.socket_path)
    pidns = pidns_process.pidns
    try:
        await client.watch(protocol.CMD_DETECT, pidns_process)  # no receiver: the notice is dropped
        call = asyncio.create_task(ioctl(kernel.hook_path, pidns))
        await wait_until(lambda: kernel.state.entries[pidns].blocked == 1, what="blocked caller")
        assert kernel.dropped == 1
        assert await client.status(protocol.CMD_DELETE, [pidns]) == 1
        await asyncio.wait_for(call, 5)
        assert pidns not in kernel.state.entries
        reply = protocol.decode_reply(await client.send(protocol.encode_command(protocol.CMD_STATS, 2)))
        assert reply.stats == () and reply.stats_head is not None and reply.stats_head.entries == 0
    finally:
        client.close()


async def test_targets_must_name_a_live_process_of_their_namespace(
        kernel: KernelStandIn, namespaces: Namespaces) -> None:
    client = await RawClient.connect(kernel.socket_path)
    a, b = namespaces.new(), namespaces.new()
    try:
        gone = await client.reply(protocol.CMD_ADD, targets=[protocol.Target(a.pidns, dead_pid())])
        assert (gone.header.status, gone.statuses) == (-errno.ESRCH, (-errno.ESRCH,))
        mixed = await client.reply(protocol.CMD_DETECT, targets=[a.target, protocol.Target(b.pidns, a.pid)])
        assert (mixed.header.status, mixed.statuses) == (-errno.ESTALE, (0, -errno.ESTALE))
        assert list(kernel.state.entries) == [a.pidns]  # only the good target has an entry
        assert await client.watch(protocol.CMD_ADD, a) == 0  # again: idempotent, one pin
        assert os.readlink(f"/proc/self/fd/{kernel.state.entries[a.pidns].pin}") == f"pid:[{a.pidns}]"
    finally:
        client.close()


async def test_a_watched_namespace_id_is_not_reused_until_deleted(
        kernel: KernelStandIn, namespaces: Namespaces) -> None:
    """The kernel hands out the lowest free namespace id. A (watched) and Z (a control) die, A with
    the lower id: Z's id is handed out again but never A's while the entry pins A, and A's once
    DELETE let it go. The ids come from one allocator for the whole machine (every kind of
    namespace): a freed one may go to another process first, which counts as handed out."""
    client = await RawClient.connect(kernel.socket_path)
    try:
        a, z = sorted((namespaces.new(), namespaces.new()), key=lambda p: p.pidns)  # another may free one between
        assert await client.watch(protocol.CMD_ADD, a) == 0
        for process in (a, z):
            process.stop()
            await wait_until(process.gone, what="the namespace's process reaped")
        seen, elsewhere = await probe_until(namespaces, {a.pidns, z.pidns})
        assert z.pidns in seen | elsewhere and a.pidns not in seen | elsewhere
        assert os.readlink(f"/proc/self/fd/{kernel.state.entries[a.pidns].pin}") == f"pid:[{a.pidns}]"
        assert await client.status(protocol.CMD_DELETE, [a.pidns]) == 0
        seen, elsewhere = await probe_until(namespaces, {a.pidns})
        assert a.pidns in seen | elsewhere
    finally:
        client.close()


async def probe_until(namespaces: Namespaces, wanted: set[int],
                      timeout: float = 20.0) -> tuple[set[int], set[int]]:  # fmt: skip
    """New namespaces until an id of ``wanted`` is taken again: every id they took, and those of
    ``wanted`` another process's namespace took. The kernel hands out the lowest free id: a probe
    that took a lower one fills a hole and stays, so the next looks higher; one that took only ids
    above ``wanted`` means none of them is free yet (a namespace's id is freed an RCU grace period
    after its last process is reaped): it goes, and the next comes a little later."""
    seen: set[int] = set()
    elsewhere: set[int] = set()
    deadline = asyncio.get_running_loop().time() + timeout
    while not (seen | elsewhere) & wanted and asyncio.get_running_loop().time() < deadline:
        probe = await asyncio.to_thread(namespaces.new)
        seen |= probe.inums
        if min(probe.inums) > max(wanted):
            probe.stop()
            elsewhere |= await asyncio.to_thread(namespace_ids_in_use, wanted)
            await asyncio.sleep(0.005)
    return seen, elsewhere


def namespace_ids_in_use(ids: set[int]) -> set[int]:
    """Those of ``ids`` a namespace of some process on the machine has now."""
    found: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for link in (proc / "ns").iterdir():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    inum = int(os.readlink(link).rsplit("[", 1)[1].rstrip("]"))
                    if inum in ids:
                        found.add(inum)
    return found


async def test_hold_moves_the_deadline_up_to_max_hold(kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    kernel.state.timeout_ms, kernel.state.max_hold_ms = 300, 1200
    client = await RawClient.connect(kernel.socket_path)
    pidns = pidns_process.pidns
    try:
        await client.status(protocol.CMD_REGISTER)
        await client.watch(protocol.CMD_DETECT, pidns_process)
        assert await client.status(protocol.CMD_HOLD, [pidns]) == 0  # nothing to hold yet
        call = asyncio.create_task(ioctl(kernel.hook_path, pidns))
        await client.next()  # the notice
        moved = 0
        while not call.done():
            await asyncio.wait({call}, timeout=0.1)
            reply = await client.reply(protocol.CMD_HOLD, [pidns])
            assert reply.stats_head is not None and reply.stats_head.max_hold_ms == 1200
            moved += reply.header.status
        held = call.result()
        entry = kernel.state.entries[pidns]
        assert 1200 - 20 <= held < 1200 + 500, "HOLD keeps the owner until hit + max_hold, not longer"
        assert moved >= 6 and entry.holds == moved and (entry.timeouts, entry.releases) == (1, 0)
        assert await client.status(protocol.CMD_HOLD, [pidns]) == 0  # a HOLD never revives a reclaim
    finally:
        client.close()


async def test_register_sends_the_notice_of_a_reclaim_again(
        kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    first = await RawClient.connect(kernel.socket_path)
    pidns = pidns_process.pidns
    await first.status(protocol.CMD_REGISTER)
    first.close()  # the receiver is gone at the hit
    second = await RawClient.connect(kernel.socket_path)
    try:
        await second.watch(protocol.CMD_DETECT, pidns_process)
        call = asyncio.create_task(ioctl(kernel.hook_path, pidns, pid=pidns_process.pid))
        await wait_until(lambda: kernel.state.entries[pidns].blocked == 1, what="the owner blocked")
        assert kernel.dropped == 1
        assert await second.status(protocol.CMD_REGISTER) == 0
        notice = protocol.decode_notice(await second.next())
        hit = kernel.state.entries[pidns].hit
        assert hit is not None and (notice.pidns, notice.pid, notice.ts_ns) == (pidns, pidns_process.pid, hit.ts_ns)
        assert notice.resent and not call.done()
        assert await second.status(protocol.CMD_REGISTER) == 0
        assert protocol.decode_notice(await second.next()).ts_ns == hit.ts_ns  # again, the same hit
        assert await second.status(protocol.CMD_RELEASE, [pidns]) == 1
        await asyncio.wait_for(call, 5)
        assert await second.status(protocol.CMD_REGISTER) == 0
        stats = await second.reply(protocol.CMD_STATS)  # the next message is this reply: no notice
        assert stats.stats_head is not None and stats.stats_head.notices_sent == 2
    finally:
        second.close()


async def test_bad_hook_lines_get_an_error(kernel: KernelStandIn) -> None:
    reader, writer = await asyncio.open_unix_connection(kernel.hook_path)
    writer.write(b"not json\n{\"pid\": 1}\n")
    await writer.drain()
    answers = [json.loads(await reader.readline()) for _ in range(2)]
    writer.close()
    assert all("error" in a for a in answers)


def test_runs_as_a_program(sock_dir: Path) -> None:
    sock, hook = sock_dir / "k.sock", sock_dir / "h.sock"
    proc = subprocess.Popen([sys.executable, "-m", "gpushare_sim.kernel", "--socket", str(sock),
                             "--hook-socket", str(hook)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert "commands on" in proc.stdout.readline()
        assert sock.exists() and hook.exists()
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(10) == 0
        if proc.stdout is not None:
            proc.stdout.close()
    assert not sock.exists() and not hook.exists()


async def test_a_guard_sees_a_borrower_alive_at_the_release(kernel: KernelStandIn, namespaces: Namespaces) -> None:
    """The instrument the soak uses: at the instant the owner's call is let go, a borrower's
    pid namespace that still has a live process is a verdict with ``alive`` set."""
    mine = os.stat("/proc/self/ns/pid").st_ino  # this test's own namespace: alive for sure
    first, second = namespaces.new(), namespaces.new()
    kernel.state.add(first.pidns, first.pid, detect=True)
    kernel.state.guards.arm(first.pidns, [mine, 123456789])
    call = asyncio.create_task(ioctl(kernel.hook_path, first.pidns))
    await wait_until(lambda: kernel.state.entries[first.pidns].reclaiming)
    assert kernel.state.release(first.pidns) == 1
    await call
    (verdict,) = kernel.state.guards.verdicts
    assert verdict["how"] == "release" and verdict["alive"] and verdict["borrowers"] == [mine, 123456789]
    kernel.state.add(second.pidns, second.pid, detect=True)
    kernel.state.guards.arm(second.pidns, [123456789])  # nothing lives there
    call = asyncio.create_task(ioctl(kernel.hook_path, second.pidns))
    await wait_until(lambda: kernel.state.entries[second.pidns].reclaiming)
    kernel.state.release(second.pidns)
    await call
    assert kernel.state.guards.verdicts[-1]["alive"] == []


async def test_a_guard_is_settled_when_the_deadline_lets_the_owner_go(
        kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    kernel.state.timeout_ms = 100
    mine = os.stat("/proc/self/ns/pid").st_ino
    kernel.state.add(pidns_process.pidns, pidns_process.pid, detect=True)
    kernel.state.guards.arm(pidns_process.pidns, [mine])
    assert await ioctl(kernel.hook_path, pidns_process.pidns) >= 100
    (verdict,) = kernel.state.guards.verdicts
    assert verdict["how"] == "timeout" and verdict["alive"]


CALLER = """
import json, os, socket, sys
sock = socket.socket(socket.AF_UNIX)
sock.connect(sys.argv[1])
line = {"pidns": os.stat("/proc/self/ns/pid").st_ino, "pid": os.getpid(), "type": 0x46}
sock.sendall(json.dumps(line).encode() + b"\\n")
print(os.getpid(), sock.makefile().readline(), flush=True)
"""


def _as_host_sees(pid: int) -> tuple[int, int]:
    """A live host pid's pid in its own namespace, and that namespace."""
    nspid = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("NSpid:"))
    return int(nspid.split()[-1]), Path(f"/proc/{pid}/ns/pid").stat().st_ino


async def test_a_notice_names_the_callers_host_pid(kernel: KernelStandIn) -> None:
    """As the module reports ``task_tgid_nr`` (the pid the host sees), a workload in a container,
    which knows only its pid inside its namespace, still makes a notice with its host pid."""
    receiver = await RawClient.connect(kernel.socket_path)
    holder = PidnsProcess()
    try:
        assert await receiver.status(protocol.CMD_REGISTER) == 0
        assert await receiver.watch(protocol.CMD_DETECT, holder) == 0
        # a process in the watched namespace: nsenter into it (the pid namespace of holder's child)
        caller = await asyncio.create_subprocess_exec(
            "nsenter", "-t", str(holder.pid), "-U", "-p", "--preserve-credentials", "--",
            sys.executable, "-c", CALLER, kernel.hook_path, stdout=subprocess.PIPE)
        notice = protocol.decode_notice(await receiver.next())
        assert notice.pidns == holder.pidns
        inside_pid, pidns = await asyncio.to_thread(_as_host_sees, notice.pid)
        assert pidns == holder.pidns
        assert await receiver.status(protocol.CMD_RELEASE, [holder.pidns]) == 1
        out, _ = await asyncio.wait_for(caller.communicate(), 10)
        assert int(out.split()[0]) == inside_pid != notice.pid
    finally:
        receiver.close()
        holder.stop()


async def test_a_guard_holds_its_borrowers_namespaces_until_the_verdict(kernel: KernelStandIn,
                                                                       namespaces: Namespaces) -> None:
    """A borrower that dies just before the release frees its namespace id, which the kernel
    hands to the next namespace at once: armed with a live pid, the guard holds the namespace
    open, so a new container cannot pass for the borrower, and lets it go at the verdict."""
    owner, borrower = namespaces.new(), PidnsProcess()
    kernel.state.add(owner.pidns, owner.pid, detect=True)
    kernel.state.guards.arm(owner.pidns, [borrower.pidns], [borrower.pid, 999_999_999])
    (fd,) = kernel.state.guards.pinned[owner.pidns]
    assert os.fstat(fd).st_ino == borrower.pidns
    borrower.stop()
    newcomer = PidnsProcess()  # takes the lowest free namespace ids
    try:
        assert borrower.pidns not in newcomer.inums
        call = asyncio.create_task(ioctl(kernel.hook_path, owner.pidns))
        await wait_until(lambda: kernel.state.entries[owner.pidns].reclaiming)
        kernel.state.release(owner.pidns)
        await call
        assert kernel.state.guards.verdicts[-1]["alive"] == [] and owner.pidns not in kernel.state.guards.pinned
        with pytest.raises(OSError):
            os.fstat(fd)  # closed at the verdict
    finally:
        newcomer.stop()
