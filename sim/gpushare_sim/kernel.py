"""A stand-in for the gpushare kernel module, for the local cluster and tests.

    python -m gpushare_sim.kernel --socket PATH --hook-socket PATH [--timeout-ms 3000]

It keeps the module's state machine (``kmod/include/gpushare_kmod.h``): the
container map (pid namespace -> watched, need_notice, counters), detect and
undetect, one notice per hit in detect mode, blocking the caller until
RELEASE, DELETE or the timeout, and STATS. Two unix stream sockets:

* ``--socket``: the netlink protocol's exact bytes (``nlmsghdr`` + kmod
  header + items), framed by ``nlmsg_len``; each connection is one netlink
  port (ids from 1000 up). REGISTER makes a connection the notice receiver;
  commands get one reply each, validated as the module validates them.
* ``--hook-socket``: simulated workloads report an "ioctl" with one JSON line
  ``{"pidns": <int>, "pid": <int>, "type": 70}``; the answer
  ``{"blocked_ms": <float>}`` comes only when the call may proceed (at once
  if the namespace is not mapped; after RELEASE or the timeout when the call
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
import struct
import time
from dataclasses import dataclass, field

VERSION, MAX_IDS, MAX_TYPES, MAX_MAJORS = 1, 1024, 16, 16
MSG_CMD, MSG_REPLY, MSG_NOTICE = 0x10, 0x11, 0x12
REGISTER, ADD, DELETE, DETECT, UNDETECT, RELEASE, STATS, CONFIG, NOTICE = range(1, 10)
F_WATCHED, F_NEED_NOTICE, F_RECLAIMING = 1, 2, 4
NLMSGHDR = struct.Struct("<IHHII")
HDR = struct.Struct("<HHIiI")
STATS_HEAD = struct.Struct("<QQQIIII")
RECORD = struct.Struct("<QQQQQQII")
CONFIG_ITEM = struct.Struct(f"<II{MAX_TYPES}s{MAX_MAJORS}I")
NOTICE_ITEM = struct.Struct("<QQIIII")
FIRST_PORT = 1000


def frame(nl_type: int, nl_seq: int, cmd: int, seq: int, status: int, count: int, items: bytes) -> bytes:
    body = HDR.pack(VERSION, cmd, seq, status, count) + items
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), nl_type, 0, nl_seq, 0) + body


@dataclass
class Entry:
    pidns: int
    need_notice: bool = False
    reclaiming: bool = False
    dead: bool = False
    deadline: float = 0.0
    hits: int = 0
    notices: int = 0
    releases: int = 0
    timeouts: int = 0
    blocked: int = 0
    last_access_ns: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def flags(self) -> int:
        return F_WATCHED | (F_NEED_NOTICE if self.need_notice else 0) | \
            (F_RECLAIMING if self.reclaiming else 0)

    def record(self) -> bytes:
        return RECORD.pack(self.pidns, self.last_access_ns, self.hits, self.notices, self.releases,
                           self.timeouts, self.blocked, self.flags())

    def end_reclaim(self, dead: bool = False) -> int:
        ended, self.reclaiming = self.reclaiming, False
        self.dead = self.dead or dead
        if ended and not dead:
            self.releases += 1
        self.wake.set()
        self.wake = asyncio.Event()
        return self.blocked


class Guards:
    """A test instrument, not part of the module: the borrowers an owner's return must outlive.

    ``arm(owner, borrowers)`` names the pid namespaces of the borrowers of an owner's card; the
    instant the owner's blocked call is let go (RELEASE, DELETE or the timeout), every process
    of the node is looked at, and a borrower namespace that still has a live process makes a
    verdict with ``alive`` set: the owner ran beside its borrower. Checked causally, at the
    release itself, not from timestamps."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self.armed: dict[int, tuple[int, ...]] = {}
        self.verdicts: list[dict[str, object]] = []

    def arm(self, owner: int, borrowers: list[int]) -> None:
        self.armed[owner] = tuple(borrowers)

    def settle(self, owner: int, how: str) -> None:
        borrowers = self.armed.pop(owner, ())
        if borrowers:
            alive = sorted(self._live_pids(set(borrowers)))
            self.verdicts.append({"owner": owner, "borrowers": list(borrowers), "how": how,
                                  "alive": alive, "ts": time.time()})  # fmt: skip

    def _live_pids(self, namespaces: set[int]) -> list[int]:
        found = []
        for name in os.listdir(self.proc):
            if not name.isdigit():
                continue
            try:
                if os.stat(f"{self.proc}/{name}/ns/pid").st_ino in namespaces and not _zombie(self.proc, name):
                    found.append(int(name))
            except OSError:
                continue
        return found


def _zombie(proc: str, pid: str) -> bool:
    with open(f"{proc}/{pid}/stat", encoding="ascii", errors="replace") as handle:
        return handle.read().rsplit(")", 1)[-1].split()[0] in ("Z", "X")


class KernelState:
    """The container map and the owner-back wait, as the module keeps them."""

    def __init__(self, timeout_ms: int = 3000, max_entries: int = 4096) -> None:
        self.timeout_ms = timeout_ms
        self.max_entries = max_entries
        self.entries: dict[int, Entry] = {}
        self.types: bytes = bytes([0x46])
        self.majors: tuple[int, ...] = ()
        self.notify = lambda pidns, pid, ioctl_cmd, ts_ns: False  # set by the server
        self.guards = Guards()

    def add(self, pidns: int, detect: bool) -> int:
        entry = self.entries.get(pidns)
        if entry is None:
            if len(self.entries) >= self.max_entries:
                return -errno.ENOSPC
            entry = self.entries[pidns] = Entry(pidns)
        entry.need_notice = entry.need_notice or detect
        return 0

    def delete(self, pidns: int) -> int:
        entry = self.entries.pop(pidns, None)
        if entry is not None and entry.reclaiming:
            self.guards.settle(pidns, "delete")
        return entry.end_reclaim(dead=True) if entry else 0

    def undetect(self, pidns: int) -> int:
        if pidns in self.entries:
            self.entries[pidns].need_notice = False
        return 0

    def release(self, pidns: int) -> int:
        entry = self.entries.get(pidns)
        if entry is not None and entry.reclaiming:
            self.guards.settle(pidns, "release")
        return entry.end_reclaim() if entry else 0

    async def hit(self, pidns: int, pid: int, ioctl_type: int) -> float:
        """One watched ioctl: count it, maybe notify, wait while reclaiming; ms blocked."""
        entry = self.entries.get(pidns)
        if entry is None or ioctl_type not in self.types:
            return 0.0
        start = time.monotonic_ns()
        entry.hits += 1
        entry.last_access_ns = start
        if entry.need_notice:
            entry.need_notice, entry.reclaiming = False, True
            entry.deadline = time.monotonic() + self.timeout_ms / 1000
            entry.notices += 1
            self.notify(pidns, pid, ioctl_type << 8, start)
        if entry.reclaiming:
            await self._wait(entry)
        return (time.monotonic_ns() - start) / 1e6

    async def _wait(self, entry: Entry) -> None:
        entry.blocked += 1
        wake = entry.wake
        try:
            await asyncio.wait_for(wake.wait(), max(0.0, entry.deadline - time.monotonic()))
        except TimeoutError:
            if entry.reclaiming and entry.wake is wake:
                entry.timeouts += 1
                self.guards.settle(entry.pidns, "timeout")
                entry.reclaiming = False
                entry.wake.set()
                entry.wake = asyncio.Event()
        finally:
            entry.blocked -= 1

    def stats(self, ids: list[int]) -> list[Entry]:
        chosen = [self.entries[i] for i in ids if i in self.entries] if ids else list(self.entries.values())
        return chosen[:MAX_IDS]


class KernelStandIn:
    """Both sockets around one :class:`KernelState`."""

    def __init__(self, socket_path: str, hook_path: str, timeout_ms: int = 3000,
                 max_entries: int = 4096) -> None:
        self.socket_path = socket_path
        self.hook_path = hook_path
        self.state = KernelState(timeout_ms, max_entries)
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
        for entry in list(self.state.entries.values()):
            entry.end_reclaim(dead=True)  # unload wakes every waiter
        for server in self._servers:
            server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        if self.receiver is not None:
            self.receiver[1].close()
        for path in (self.socket_path, self.hook_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    # --- notices -----------------------------------------------------------------

    def _notify(self, pidns: int, pid: int, ioctl_cmd: int, ts_ns: int) -> bool:
        self.notice_seq += 1
        item = NOTICE_ITEM.pack(pidns, ts_ns, pid, pid, ioctl_cmd, 0)
        if self.receiver is None or self.receiver[1].is_closing():
            self.dropped += 1
            return False
        self.receiver[1].write(frame(MSG_NOTICE, self.notice_seq, NOTICE, self.notice_seq, 0, 1, item))
        self.sent += 1
        return True

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
        """One command message -> its reply bytes."""
        cmd = seq = count = 0
        if len(payload) >= HDR.size:
            _version, cmd, seq, _status, count = HDR.unpack_from(payload)
        status = check(nl_type, payload)
        if status:
            return frame(MSG_REPLY, nl_seq, cmd, seq, status, 0, b"")
        items = payload[HDR.size :]
        if cmd == REGISTER:
            self.receiver = (port, writer)
        elif cmd == CONFIG:
            return self._config(nl_seq, seq, count, items)
        ids = [struct.unpack_from("<Q", items, 8 * i)[0] for i in range(count)]
        if any(i == 0 or i > 0xFFFFFFFF for i in ids):
            return frame(MSG_REPLY, nl_seq, cmd, seq, -errno.EINVAL, 0, b"")
        if cmd == STATS:
            records = self.state.stats(ids)
            head = STATS_HEAD.pack(time.monotonic_ns(), self.sent, self.dropped, len(self.state.entries),
                                   self.state.max_entries, self.receiver[0] if self.receiver else 0,
                                   self.state.timeout_ms)
            return frame(MSG_REPLY, nl_seq, cmd, seq, 0, len(records),
                         head + b"".join(e.record() for e in records))
        return frame(MSG_REPLY, nl_seq, cmd, seq, self._ids(cmd, ids), 0, b"")

    def _ids(self, cmd: int, ids: list[int]) -> int:
        total = 0
        for pidns in ids:
            result = {ADD: lambda p: self.state.add(p, False), DETECT: lambda p: self.state.add(p, True),
                      DELETE: self.state.delete, UNDETECT: self.state.undetect,
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

    def _instrument(self, call: dict[str, object]) -> dict[str, object]:
        return _instrument(self.state, call)

    async def _hook_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    call = json.loads(line)
                    if isinstance(call, dict) and "op" in call:
                        writer.write(json.dumps(self._instrument(call)).encode() + b"\n")
                        await writer.drain()
                        continue
                    pidns, pid, ioctl_type = int(call["pidns"]), int(call["pid"]), int(call.get("type", 0x46))
                except (ValueError, KeyError, TypeError) as err:
                    writer.write(json.dumps({"error": f"bad hook line: {err!r}"}).encode() + b"\n")
                    continue
                blocked_ms = await self.state.hit(pidns, pid, ioctl_type)
                writer.write(json.dumps({"blocked_ms": round(blocked_ms, 3)}).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


def _instrument(state: KernelState, call: dict[str, object]) -> dict[str, object]:
    """The test instrument's lines: ``{"op": "guard", "owner": ns, "borrowers": [ns, ...]}``
    and ``{"op": "verdicts"}`` (every verdict so far)."""
    if call.get("op") == "guard":
        listed, owner = call.get("borrowers"), call.get("owner")
        try:
            borrowers = [int(b) for b in listed] if isinstance(listed, list) else []
            state.guards.arm(int(str(owner)), borrowers)
        except (TypeError, ValueError) as err:
            return {"error": f"bad guard line: {err!r}"}
        return {"armed": True}
    if call.get("op") == "verdicts":
        return {"verdicts": state.guards.verdicts}
    return {"error": f"unknown op {call.get('op')!r}"}


def check(nl_type: int, payload: bytes) -> int:
    """The module's validation of one command: 0 or a negative errno."""
    if nl_type != MSG_CMD or len(payload) < HDR.size:
        return -errno.EINVAL
    version, cmd, _seq, _status, count = HDR.unpack_from(payload)
    if version != VERSION:
        return -errno.EPROTO
    if not REGISTER <= cmd <= CONFIG:
        return -errno.EOPNOTSUPP
    if count > MAX_IDS:
        return -errno.EINVAL
    if cmd == REGISTER:
        want = 0 if count == 0 else -1
    elif cmd == CONFIG:
        want = count * CONFIG_ITEM.size if count <= 1 else -1
    else:
        want = count * 8
    return 0 if want >= 0 and len(payload) == HDR.size + want else -errno.EINVAL


async def serve(args: argparse.Namespace) -> None:
    kernel = KernelStandIn(args.socket, args.hook_socket, args.timeout_ms, args.max_entries)
    await kernel.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"kernel stand-in: commands on {args.socket}, hooks on {args.hook_socket}", flush=True)
    await stop.wait()
    await kernel.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpushare_sim.kernel", description=__doc__.split("\n")[0])
    parser.add_argument("--socket", required=True, help="command socket (netlink bytes)")
    parser.add_argument("--hook-socket", required=True, help="workload ioctl reports (JSON lines)")
    parser.add_argument("--timeout-ms", type=int, default=3000, help="longest owner-back wait")
    parser.add_argument("--max-entries", type=int, default=4096, help="container map capacity")
    asyncio.run(serve(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
