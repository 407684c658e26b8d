"""The kernel stand-in (sim/gpushare_sim/kernel.py) behaves as the module's header says."""

from __future__ import annotations

import asyncio
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

from .conftest import ioctl, wait_until


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
        reply = protocol.decode_reply(await self.send(protocol.encode_command(cmd, 1, ids)))
        return reply.header.status

    def close(self) -> None:
        self.writer.close()


def raw_command(cmd: int, count: int, items: bytes, version: int = 1, nl_type: int = protocol.MSG_CMD) -> bytes:
    return protocol.encode_frame(nl_type, 3, protocol.Header(cmd, 3, count=count, version=version), items)


@pytest.mark.parametrize(("data", "status"), [
    (raw_command(protocol.CMD_ADD, 1, struct.pack("<Q", 5), version=2), -errno.EPROTO),
    (raw_command(42, 0, b""), -errno.EOPNOTSUPP),
    (raw_command(protocol.CMD_ADD, 2, struct.pack("<Q", 5)), -errno.EINVAL),  # truncated
    (raw_command(protocol.CMD_ADD, 1, struct.pack("<QQ", 5, 6)), -errno.EINVAL),  # longer
    (raw_command(protocol.CMD_ADD, 1, struct.pack("<Q", 0)), -errno.EINVAL),  # id 0
    (raw_command(protocol.CMD_ADD, 1, struct.pack("<Q", 2**32)), -errno.EINVAL),  # above U32_MAX
    (raw_command(protocol.CMD_ADD, 1025, bytes(8 * 1025)), -errno.EINVAL),  # oversize
    (raw_command(protocol.CMD_REGISTER, 1, struct.pack("<Q", 5)), -errno.EINVAL),
    (raw_command(protocol.CMD_ADD, 1, struct.pack("<Q", 5), nl_type=protocol.MSG_REPLY), -errno.EINVAL),
])
async def test_malformed_commands_get_the_modules_errors(kernel: KernelStandIn, data: bytes, status: int) -> None:
    client = await RawClient.connect(kernel.socket_path)
    try:
        reply = protocol.decode_reply(await client.send(data))
        assert reply.header.status == status
        assert kernel.state.entries == {}
    finally:
        client.close()


async def test_hit_without_detect_passes_and_counts(kernel: KernelStandIn) -> None:
    client = await RawClient.connect(kernel.socket_path)
    try:
        assert await client.status(protocol.CMD_ADD, [11]) == 0
        assert await ioctl(kernel.hook_path, 11) < 100
        assert await ioctl(kernel.hook_path, 12) == 0  # not mapped
        assert await ioctl(kernel.hook_path, 11, ioctl_type=0x41) == 0  # not a watched type
        assert kernel.state.entries[11].hits == 1 and kernel.state.entries[11].notices == 0
    finally:
        client.close()


async def test_timeout_ends_the_wait_and_is_counted(kernel: KernelStandIn) -> None:
    kernel.state.timeout_ms = 150
    client = await RawClient.connect(kernel.socket_path)
    try:
        assert await client.status(protocol.CMD_REGISTER) == 0
        assert await client.status(protocol.CMD_DETECT, [21]) == 0
        held = await ioctl(kernel.hook_path, 21, pid=9)
        notice = protocol.decode_notice(await client.next())
        assert (notice.pidns, notice.pid, notice.seq) == (21, 9, 1)
        assert 140 <= held < 1000
        entry = kernel.state.entries[21]
        assert (entry.timeouts, entry.releases, entry.reclaiming, entry.need_notice) == (1, 0, False, False)
        assert await ioctl(kernel.hook_path, 21) < 100  # one notice per detect
    finally:
        client.close()


async def test_other_callers_wait_on_the_same_release(kernel: KernelStandIn) -> None:
    client = await RawClient.connect(kernel.socket_path)
    try:
        await client.status(protocol.CMD_REGISTER)
        await client.status(protocol.CMD_DETECT, [31])
        first = asyncio.create_task(ioctl(kernel.hook_path, 31, pid=1))
        await client.next()  # the notice
        second = asyncio.create_task(ioctl(kernel.hook_path, 31, pid=2))
        await wait_until(lambda: kernel.state.entries[31].blocked == 2, what="two blocked callers")
        assert kernel.sent == 1
        assert await client.status(protocol.CMD_RELEASE, [31]) == 2
        await asyncio.wait_for(asyncio.gather(first, second), 5)
    finally:
        client.close()


async def test_delete_wakes_and_forgets(kernel: KernelStandIn) -> None:
    client = await RawClient.connect(kernel.socket_path)
    try:
        await client.status(protocol.CMD_DETECT, [41])  # no receiver: the notice is dropped
        call = asyncio.create_task(ioctl(kernel.hook_path, 41))
        await wait_until(lambda: kernel.state.entries[41].blocked == 1, what="blocked caller")
        assert kernel.dropped == 1
        assert await client.status(protocol.CMD_DELETE, [41]) == 1
        await asyncio.wait_for(call, 5)
        assert 41 not in kernel.state.entries
        reply = protocol.decode_reply(await client.send(protocol.encode_command(protocol.CMD_STATS, 2)))
        assert reply.stats == () and reply.stats_head is not None and reply.stats_head.entries == 0
    finally:
        client.close()


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


async def test_a_guard_sees_a_borrower_alive_at_the_release(kernel: KernelStandIn) -> None:
    """The instrument the soak uses: at the instant the owner's call is let go, a borrower's
    pid namespace that still has a live process is a verdict with ``alive`` set."""
    mine = os.stat("/proc/self/ns/pid").st_ino  # this test's own namespace: alive for sure
    kernel.state.add(77, detect=True)
    kernel.state.guards.arm(77, [mine, 123456789])
    call = asyncio.create_task(ioctl(kernel.hook_path, 77))
    await wait_until(lambda: kernel.state.entries[77].reclaiming)
    assert kernel.state.release(77) == 1
    await call
    (verdict,) = kernel.state.guards.verdicts
    assert verdict["how"] == "release" and verdict["alive"] and verdict["borrowers"] == [mine, 123456789]
    kernel.state.add(78, detect=True)
    kernel.state.guards.arm(78, [123456789])  # nothing lives there
    call = asyncio.create_task(ioctl(kernel.hook_path, 78))
    await wait_until(lambda: kernel.state.entries[78].reclaiming)
    kernel.state.release(78)
    await call
    assert kernel.state.guards.verdicts[-1]["alive"] == []
