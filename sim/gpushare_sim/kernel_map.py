"""The kernel stand-in's container map: the module's state machine, kept exactly.

The map (pid namespace -> entry) and the owner-back wait of
``kmod/gpushare_map.c`` and ``kmod/gpushare_hook.c``: ADD/DETECT check that
the named process lives in the named pid namespace and pin the namespace
while the entry exists (here: an open fd of ``/proc/<pid>/ns/pid``, which
keeps the namespace and so its inode number from being handed out again);
one notice per hit in detect mode; the caller blocks until RELEASE, DELETE or
the deadline, which HOLD moves to now + timeout (never past hit + max_hold);
a reclaim nobody waited out ends at the next hit.

The record layouts are written here again on purpose (see ``kernel.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import struct
import time
from dataclasses import dataclass, field

from gpushare_common.hold import MODULE_MAX_HOLD_MS, MODULE_TIMEOUT_MS

from .kernel_guards import Guards

MAX_IDS = 1024
F_WATCHED, F_NEED_NOTICE, F_RECLAIMING = 1, 2, 4
NOTICE_F_RESENT = 1
RECORD = struct.Struct("<QQQQQQQQII")
NOTICE_ITEM = struct.Struct("<QQIIII")
MS = 1_000_000


@dataclass(frozen=True)
class Hit:
    """The call that started a reclaim: what its notice says, then and when sent again."""

    pidns: int
    ts_ns: int
    pid: int
    ioctl_cmd: int

    def item(self, flags: int = 0) -> bytes:
        return NOTICE_ITEM.pack(self.pidns, self.ts_ns, self.pid, self.pid, self.ioctl_cmd, flags)


def pin_namespace(pidns: int, pid: int, proc: str = "/proc") -> int:
    """An open fd of the pid namespace of ``pid`` when its id is ``pidns``; -ESRCH when there is
    no such process, -ESTALE when it lives in another namespace, -EACCES when this process may
    not look (the module runs with every right; the stand-in as whoever started it)."""
    try:
        fd = os.open(f"{proc}/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return -errno.ESRCH
    except PermissionError:
        return -errno.EACCES
    if os.fstat(fd).st_ino != pidns:
        os.close(fd)
        return -errno.ESTALE
    return fd


@dataclass
class Entry:
    pidns: int
    pin: int = -1  # the namespace's fd: its id stays taken while the entry exists
    need_notice: bool = False
    reclaiming: bool = False
    dead: bool = False
    deadline_ns: int = 0
    hit: Hit | None = None
    hits: int = 0
    notices: int = 0
    releases: int = 0
    timeouts: int = 0
    holds: int = 0
    blocked: int = 0
    last_access_ns: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def in_reclaim(self, now_ns: int) -> bool:
        return self.reclaiming and now_ns < self.deadline_ns

    def record(self, now_ns: int) -> bytes:
        live = self.in_reclaim(now_ns)
        flags = F_WATCHED | (F_NEED_NOTICE if self.need_notice else 0) | (F_RECLAIMING if live else 0)
        return RECORD.pack(self.pidns, self.last_access_ns, self.hits, self.notices, self.releases,
                           self.timeouts, self.holds, self.deadline_ns if live else 0, self.blocked, flags)

    def end_reclaim(self, dead: bool = False) -> int:
        ended, self.reclaiming = self.reclaiming, False
        self.dead = self.dead or dead
        if ended and not dead:
            self.releases += 1
        self._wake_all()
        return self.blocked

    def expire(self, now_ns: int) -> bool:
        """Ends a reclaim whose deadline has passed (counted as a timeout)."""
        if not self.reclaiming or now_ns < self.deadline_ns:
            return False
        self.reclaiming = False
        self.timeouts += 1
        self._wake_all()
        return True

    def unpin(self) -> None:
        pin, self.pin = self.pin, -1
        if pin >= 0:
            os.close(pin)

    def _wake_all(self) -> None:
        self.wake.set()
        self.wake = asyncio.Event()


class KernelState:
    """The container map and the owner-back wait, as the module keeps them."""

    def __init__(self, timeout_ms: int = MODULE_TIMEOUT_MS, max_entries: int = 4096,
                 max_hold_ms: int = MODULE_MAX_HOLD_MS, proc: str = "/proc") -> None:
        self.timeout_ms = timeout_ms
        self.max_hold_ms = max_hold_ms
        self.max_entries = max_entries
        self.proc = proc
        self.entries: dict[int, Entry] = {}
        self.types: bytes = bytes([0x46])
        self.majors: tuple[int, ...] = ()
        self.notify = lambda hit: False  # set by the server
        self.guards = Guards()  # a test instrument, told each time an owner's call is let go

    def add(self, pidns: int, pid: int, detect: bool) -> int:
        pin = pin_namespace(pidns, pid, self.proc)
        if pin < 0:
            return pin
        entry = self.entries.get(pidns)
        if entry is None and len(self.entries) >= self.max_entries:
            os.close(pin)
            return -errno.ENOSPC
        if entry is None:
            entry = self.entries[pidns] = Entry(pidns, pin=pin)
        else:
            os.close(pin)  # already held by the entry
        entry.need_notice = entry.need_notice or detect
        return 0

    def delete(self, pidns: int) -> int:
        entry = self.entries.pop(pidns, None)
        if entry is None:
            return 0
        if entry.reclaiming:
            self.guards.settle(pidns, "delete")
        woken = entry.end_reclaim(dead=True)
        entry.unpin()
        return woken

    def undetect(self, pidns: int) -> int:
        if pidns in self.entries:
            self.entries[pidns].need_notice = False
        return 0

    def release(self, pidns: int) -> int:
        entry = self.entries.get(pidns)
        if entry is not None and entry.reclaiming:
            self.guards.settle(pidns, "release")
        return entry.end_reclaim() if entry else 0

    def hold(self, pidns: int) -> int:
        """Moves a reclaim's deadline to now + timeout, at most hit + max_hold; 1 when it moved."""
        entry = self.entries.get(pidns)
        now = time.monotonic_ns()
        if entry is None or entry.hit is None or entry.dead or not entry.in_reclaim(now):
            return 0
        want = min(now + self.timeout_ms * MS, entry.hit.ts_ns + self.max_hold_ms * MS)
        if want <= entry.deadline_ns:
            return 0
        entry.deadline_ns = want
        entry.holds += 1
        return 1

    def reclaims(self) -> list[Hit]:
        """The hits of every reclaim in progress (REGISTER sends their notices again)."""
        now = time.monotonic_ns()
        return [e.hit for e in self.entries.values() if e.hit is not None and e.in_reclaim(now)]

    async def hit(self, pidns: int, pid: int, ioctl_type: int) -> float:
        """One watched ioctl: count it, maybe notify, wait while reclaiming; ms blocked."""
        entry = self.entries.get(pidns)
        if entry is None or ioctl_type not in self.types:
            return 0.0
        start = time.monotonic_ns()
        entry.hits += 1
        entry.last_access_ns = start
        self._expire(entry, start)  # a reclaim nobody waited out ends here
        if entry.need_notice and not entry.reclaiming and not entry.dead:
            entry.need_notice, entry.reclaiming = False, True
            entry.deadline_ns = start + self.timeout_ms * MS
            entry.hit = Hit(pidns, start, pid, ioctl_type << 8)
            entry.notices += 1
            self.notify(entry.hit)
        if entry.reclaiming:
            await self._wait(entry)
        return (time.monotonic_ns() - start) / 1e6

    async def _wait(self, entry: Entry) -> None:
        """Until release, delete or the deadline, read again each time a sleep ends (HOLD)."""
        entry.blocked += 1
        wake = entry.wake
        try:
            while entry.wake is wake and not self._expire(entry, time.monotonic_ns()):
                with contextlib.suppress(TimeoutError):
                    left = (entry.deadline_ns - time.monotonic_ns()) / 1e9
                    await asyncio.wait_for(wake.wait(), max(left, 0.0))
        finally:
            entry.blocked -= 1

    def _expire(self, entry: Entry, now_ns: int) -> bool:
        if entry.reclaiming and now_ns >= entry.deadline_ns:
            self.guards.settle(entry.pidns, "timeout")
        return entry.expire(now_ns)

    def stats(self, ids: list[int]) -> list[Entry]:
        chosen = [self.entries[i] for i in ids if i in self.entries] if ids else list(self.entries.values())
        return chosen[:MAX_IDS]

    def close(self) -> None:
        """Unload: every waiter woken, every namespace let go."""
        for pidns in list(self.entries):
            self.delete(pidns)
