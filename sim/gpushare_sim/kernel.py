"""A stand-in for the gpushare kernel module, for the local cluster and tests.

    python -m gpushare_sim.kernel --socket PATH --hook-socket PATH [--timeout-ms MS] [--max-hold-ms MS]

It keeps the module's state machine (``kmod/include/gpushare_kmod.h``; the
map itself is in :mod:`gpushare_sim.kernel_map`): ADD/DETECT name a pid
namespace and a host pid in it, checked against ``/proc`` and the namespace
pinned while watched; detect and undetect; one notice per hit in detect mode,
sent again to every new receiver while the reclaim lasts; blocking the caller
until RELEASE, DELETE or the deadline, which HOLD moves; STATS. Two unix stream
sockets:

* ``--socket``: the netlink protocol's exact bytes (``nlmsghdr`` + kmod
  header + items), framed by ``nlmsg_len``; each connection is one netlink
  port (ids from 1000 up). REGISTER makes a connection the notice receiver;
  commands get one reply each, validated as the module validates them.
* ``--hook-socket``: simulated workloads report an "ioctl" with one JSON line
  ``{"pidns": <int>, "pid": <int>, "type": 70}``; the answer
  ``{"blocked_ms": <float>}`` comes only when the call may proceed (at once
  if the namespace is not mapped; after RELEASE or the deadline when the call
  was the hit of a namespace in detect mode, or arrived while it was being
  reclaimed). A line that is not such JSON gets ``{"error": "..."}``.

The wire codec is written here again on purpose: the stand-in plays the
kernel and must not share the bridge's code, so a test of one against the
other checks both against the header.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import os
import signal
import socket
import struct
import time

from gpushare_common.hold import MODULE_MAX_HOLD_MS, MODULE_TIMEOUT_MS

from .kernel_guards import instrument
from .kernel_map import (
    F_NEED_NOTICE,
    F_RECLAIMING,
    F_WATCHED,
    MAX_IDS,
    NOTICE_F_RESENT,
    NOTICE_ITEM,
    RECORD,
    Hit,
    KernelState,
)

__all__ = ["F_NEED_NOTICE", "F_RECLAIMING", "F_WATCHED", "MAX_IDS", "NOTICE_F_RESENT", "NOTICE_ITEM", "RECORD",
           "KernelStandIn", "KernelState", "check"]

VERSION, MAX_TYPES, MAX_MAJORS, MAX_PARAM_MS = 2, 16, 16, 600000
MSG_CMD, MSG_REPLY, MSG_NOTICE = 0x10, 0x11, 0x12
REGISTER, ADD, DELETE, DETECT, UNDETECT, RELEASE, STATS, CONFIG, NOTICE, HOLD = range(1, 11)
NLMSGHDR = struct.Struct("<IHHII")
HDR = struct.Struct("<HHIiI")
TARGET = struct.Struct("<QII")
STATS_HEAD = struct.Struct("<QQQIIIIII")
CONFIG_ITEM = struct.Struct(f"<II{MAX_TYPES}s{MAX_MAJORS}I")
FIRST_PORT = 1000
ID_LIMIT = 0xFFFFFFFF


def frame(nl_type: int, nl_seq: int, cmd: int, seq: int, status: int, count: int, items: bytes) -> bytes:
    body = HDR.pack(VERSION, cmd, seq, status, count) + items
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), nl_type, 0, nl_seq, 0) + body


class KernelStandIn:
    """Both sockets around one :class:`KernelState`."""

    def __init__(self, socket_path: str, hook_path: str, timeout_ms: int = MODULE_TIMEOUT_MS,
                 max_entries: int = 4096, max_hold_ms: int = MODULE_MAX_HOLD_MS) -> None:
        self.socket_path = socket_path
        self.hook_path = hook_path
        self.state = KernelState(timeout_ms, max_entries, max_hold_ms)
        self.state.notify = self._notify
        self.receiver: tuple[int, asyncio.StreamWriter] | None = None
        self.notice_seq = 0
        self.sent = 0
        self.dropped = 0
        self._ports = FIRST_PORT
        self._servers: list[asyncio.Server] = []

    async def start(self) -> None:
        for path in (self.socket_path, self.hook_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self._servers = [await asyncio.start_unix_server(self._command_conn, self.socket_path),
                         await asyncio.start_unix_server(self._hook_conn, self.hook_path)]

    async def close(self) -> None:
        self.state.close()  # unload wakes every waiter and lets every namespace go
        for server in self._servers:
            server.close()
            with contextlib.suppress(Exception):  # unloading: a server slow to close is left behind
                await asyncio.wait_for(server.wait_closed(), 1.0)
        if self.receiver is not None:
            self.receiver[1].close()
        for path in (self.socket_path, self.hook_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    # --- notices -----------------------------------------------------------------

    def _notify(self, hit: Hit) -> bool:
        if self.receiver is None or self.receiver[1].is_closing():
            self.notice_seq += 1
            self.dropped += 1
            return False
        self.receiver[1].write(self._notice(hit, 0))
        return True

    def _notice(self, hit: Hit, flags: int) -> bytes:
        self.notice_seq += 1
        self.sent += 1
        return frame(MSG_NOTICE, self.notice_seq, NOTICE, self.notice_seq, 0, 1, hit.item(flags))

    # --- the command socket ---------------------------------------------------------

    async def _command_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._ports += 1
        port = self._ports
        try:
            while True:
                head = await reader.readexactly(NLMSGHDR.size)
                length, nl_type, _flags, nl_seq, _pid = NLMSGHDR.unpack(head)
                if length < NLMSGHDR.size:
                    break  # the framing is lost: drop the connection as a socket error would
                payload = await reader.readexactly(((length + 3) & ~3) - NLMSGHDR.size)
                writer.write(self.command(port, writer, nl_type, nl_seq, payload[: length - NLMSGHDR.size]))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            if self.receiver is not None and self.receiver[0] == port:
                self.receiver = None
            writer.close()

    def command(self, port: int, writer: asyncio.StreamWriter, nl_type: int, nl_seq: int,
                payload: bytes) -> bytes:
        """One command message -> its reply bytes (and, for REGISTER, the notices sent again)."""
        cmd = seq = count = 0
        if len(payload) >= HDR.size:
            _version, cmd, seq, _status, count = HDR.unpack_from(payload)
        status = check(nl_type, payload)
        if status:
            return frame(MSG_REPLY, nl_seq, cmd, seq, status, 0, b"")
        items = payload[HDR.size :]
        if cmd == REGISTER:
            self.receiver = (port, writer)
            resent = b"".join(self._notice(hit, NOTICE_F_RESENT) for hit in self.state.reclaims())
            return frame(MSG_REPLY, nl_seq, cmd, seq, 0, 0, b"") + resent
        if cmd == CONFIG:
            return self._config(nl_seq, seq, count, items)
        if cmd in (ADD, DETECT):
            return self._targets(nl_seq, cmd, seq, [TARGET.unpack_from(items, 16 * i) for i in range(count)])
        ids = [struct.unpack_from("<Q", items, 8 * i)[0] for i in range(count)]
        if any(i == 0 or i > ID_LIMIT for i in ids):
            return frame(MSG_REPLY, nl_seq, cmd, seq, -errno.EINVAL, 0, b"")
        if cmd in (STATS, HOLD):
            moved = sum(self.state.hold(p) for p in ids) if cmd == HOLD else 0
            return self._stats(nl_seq, cmd, seq, moved, ids)
        return frame(MSG_REPLY, nl_seq, cmd, seq, self._ids(cmd, ids), 0, b"")

    def _targets(self, nl_seq: int, cmd: int, seq: int, targets: list[tuple[int, int, int]]) -> bytes:
        if any(not 0 < p <= ID_LIMIT or pid == 0 or pad for p, pid, pad in targets):
            return frame(MSG_REPLY, nl_seq, cmd, seq, -errno.EINVAL, 0, b"")
        statuses = [self.state.add(p, pid, cmd == DETECT) for p, pid, _ in targets]
        status = next((s for s in statuses if s < 0), 0)
        return frame(MSG_REPLY, nl_seq, cmd, seq, status, len(statuses),
                     b"".join(struct.pack("<i", s) for s in statuses))

    def _stats(self, nl_seq: int, cmd: int, seq: int, status: int, ids: list[int]) -> bytes:
        now = time.monotonic_ns()
        records = self.state.stats(ids)
        head = STATS_HEAD.pack(now, self.sent, self.dropped, len(self.state.entries), self.state.max_entries,
                               self.receiver[0] if self.receiver else 0, self.state.timeout_ms,
                               self.state.max_hold_ms, 0)
        return frame(MSG_REPLY, nl_seq, cmd, seq, status, len(records),
                     head + b"".join(e.record(now) for e in records))

    def _ids(self, cmd: int, ids: list[int]) -> int:
        total = 0
        for pidns in ids:
            result = {DELETE: self.state.delete, UNDETECT: self.state.undetect,
                      RELEASE: self.state.release}.get(cmd, lambda p: 0)(pidns)
            if result < 0:
                return result
            total += result
        return total

    def _config(self, nl_seq: int, seq: int, count: int, items: bytes) -> bytes:
        status = 0
        if count:
            ntypes, nmajors, types, *majors = CONFIG_ITEM.unpack(items)
            if ntypes > MAX_TYPES or nmajors > MAX_MAJORS or any(m >= 4096 for m in majors[:nmajors]):
                status = -errno.EINVAL
            else:
                self.state.types, self.state.majors = types[:ntypes], tuple(majors[:nmajors])
        majors = list(self.state.majors) + [0] * (MAX_MAJORS - len(self.state.majors))
        item = CONFIG_ITEM.pack(len(self.state.types), len(self.state.majors), self.state.types, *majors)
        return frame(MSG_REPLY, nl_seq, CONFIG, seq, status, 1, item)

    # --- the hook socket ------------------------------------------------------------

    async def _hook_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer_pid(writer)
        try:
            while line := await reader.readline():
                try:
                    call = json.loads(line)
                    if isinstance(call, dict) and "op" in call:
                        writer.write(json.dumps(instrument(self.state.guards, call)).encode() + b"\n")
                        await writer.drain()
                        continue
                    pidns, pid, ioctl_type = int(call["pidns"]), int(call["pid"]), int(call.get("type", 0x46))
                except (ValueError, KeyError, TypeError) as err:
                    writer.write(json.dumps({"error": f"bad hook line: {err!r}"}).encode() + b"\n")
                    continue
                blocked_ms = await self.state.hit(pidns, _global_pid(pid, pidns, peer), ioctl_type)
                writer.write(json.dumps({"blocked_ms": round(blocked_ms, 3)}).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


def _peer_pid(writer: asyncio.StreamWriter) -> int:
    """The host pid of the process that connected to the hook socket (0 when unknown)."""
    sock = writer.get_extra_info("socket")
    try:
        return int(struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0])
    except (AttributeError, OSError, struct.error):
        return 0


def _global_pid(reported: int, pidns: int, peer: int) -> int:
    """The module reports the caller's pid as the host sees it (``task_tgid_nr``). A workload in a
    container knows only its pid inside its namespace; when the process on the other end of the
    socket lives in the reported namespace, it is the caller, and its host pid is the one sent.
    A line written on another process's behalf (tests) keeps the pid it names."""
    if peer > 0:
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{peer}/ns/pid").st_ino == pidns:
                return peer
    return reported


def check(nl_type: int, payload: bytes) -> int:
    """The module's validation of one command: 0 or a negative errno."""
    if nl_type != MSG_CMD or len(payload) < HDR.size:
        return -errno.EINVAL
    version, cmd, _seq, _status, count = HDR.unpack_from(payload)
    if version != VERSION:
        return -errno.EPROTO
    if not REGISTER <= cmd <= HOLD or cmd == NOTICE:
        return -errno.EOPNOTSUPP
    if count > MAX_IDS:
        return -errno.EINVAL
    if cmd == REGISTER:
        want = 0 if count == 0 else -1
    elif cmd == CONFIG:
        want = count * CONFIG_ITEM.size if count <= 1 else -1
    else:
        want = count * (TARGET.size if cmd in (ADD, DETECT) else 8)
    return 0 if want >= 0 and len(payload) == HDR.size + want else -errno.EINVAL


async def serve(args: argparse.Namespace) -> None:
    kernel = KernelStandIn(args.socket, args.hook_socket, args.timeout_ms, args.max_entries, args.max_hold_ms)
    await kernel.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"kernel stand-in: commands on {args.socket}, hooks on {args.hook_socket}", flush=True)
    await stop.wait()
    await kernel.close()


def _ms(text: str) -> int:
    """A time parameter as the module takes it: 1..MAX_PARAM_MS milliseconds."""
    value = int(text)
    if not 0 < value <= MAX_PARAM_MS:
        raise argparse.ArgumentTypeError(f"{value} ms is outside 1..{MAX_PARAM_MS}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpushare_sim.kernel", description=__doc__.split("\n")[0])
    parser.add_argument("--socket", required=True, help="command socket (netlink bytes)")
    parser.add_argument("--hook-socket", required=True, help="workload ioctl reports (JSON lines)")
    parser.add_argument("--timeout-ms", type=_ms, default=MODULE_TIMEOUT_MS,
                        help="owner-back wait after the hit or a HOLD (the module parameter timeout_ms)")
    parser.add_argument("--max-hold-ms", type=_ms, default=MODULE_MAX_HOLD_MS,
                        help="no HOLD past this long after the hit (the module parameter max_hold_ms)")
    parser.add_argument("--max-entries", type=int, default=4096, help="container map capacity")
    asyncio.run(serve(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
