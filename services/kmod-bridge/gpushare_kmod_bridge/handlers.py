"""Pure functions of the bridge: commands to kernel operations, kernel answers to events."""

from __future__ import annotations

import errno
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence

import gpushare_common.events as events
from gpushare_common.hold import HoldTiming

from . import protocol
from .resolver import Owner, Snapshot
from .watchset import Owned, WatchEntry

ENOTCONN = -errno.ENOTCONN
ENOENT = -errno.ENOENT
EPERM = -errno.EPERM
EINVAL = -errno.EINVAL
ESRCH = -errno.ESRCH

KERNEL_OPS: dict[str, int] = {
    "add": protocol.CMD_ADD,
    "delete": protocol.CMD_DELETE,
    "detect": protocol.CMD_DETECT,
    "undetect": protocol.CMD_UNDETECT,
    "release": protocol.CMD_RELEASE,
    "stats": protocol.CMD_STATS,
    "hold": protocol.CMD_HOLD,
}
WHY = {  # what a target's status means, for the reply's message
    -errno.ESRCH: "no such process",
    -errno.ESTALE: "the process lives in another pid namespace",
    -errno.ENOSPC: "the kernel's map is full",
    -errno.ENOMEM: "the kernel is out of memory",
}


def chunks(ids: Sequence[int], size: int = protocol.MAX_IDS) -> list[list[int]]:
    return [list(ids[i : i + size]) for i in range(0, len(ids), size)] or [[]]


def combine(statuses: Sequence[int]) -> int:
    """One status for several kernel replies: the first error, else the sum (tasks woken)."""
    errors = [s for s in statuses if s < 0]
    return errors[0] if errors else sum(statuses)


def owner_of(entry: WatchEntry | None, owner: Owner | None) -> tuple[str, str]:
    """Who a pid namespace belongs to: the container living in it now (the resolver), else the
    command that named it."""
    if owner is not None and owner.pod:
        return owner.pod, owner.container
    if entry is not None and entry.pod:
        return entry.pod, entry.container
    return "", ""


def is_stale(entry: WatchEntry | None, owner: Owner | None, snapshot: Snapshot) -> bool:
    """Whether an entry bound to a container no longer describes its namespace: another
    container lives there now (the kernel reused the inode), or a complete listing of the
    node's containers no longer has the entry's container."""
    if entry is None or not entry.container_id:
        return False
    if owner is not None and owner.container_id:
        return owner.container_id != entry.container_id
    return snapshot.complete and entry.container_id not in snapshot.container_ids


def owner_back_id(node: str, pidns: int, kernel_ts_ns: int) -> str:
    """One id per hit: a notice the kernel sends again (to a new receiver) makes the same event,
    which the stream de-duplicates and the solver handles once."""
    return hashlib.sha256(f"ownerback\n{node}\n{pidns}\n{kernel_ts_ns}".encode()).hexdigest()[:32]


def owner_back(node: str, notice: protocol.Notice, pod: str, container: str,
               publish_ns: int) -> events.OwnerBackEvent:
    return events.OwnerBackEvent(
        node=node, id=owner_back_id(node, notice.pidns, notice.ts_ns),
        pidns=notice.pidns, pid=notice.pid, kernel_ts_ns=notice.ts_ns,
        pod=pod, container=container, resolved=bool(pod),
        notice_to_publish_ms=max(0.0, (publish_ns - notice.ts_ns) / 1e6),
    )


def live_pid(pidns: int, container_ids: Iterable[str], snapshot: Snapshot,
             pidns_of: Callable[[int], int | None]) -> int | None:
    """A pid the last listing saw in one of these containers that still lives in ``pidns``."""
    for container_id in dict.fromkeys(c for c in container_ids if c):
        for pid in snapshot.pids.get(container_id, ()):
            if pidns_of(pid) == pidns:
                return pid
    return None


def targets(ids: Iterable[int], containers: Callable[[int], Iterable[str]], snapshot: Snapshot,
            pidns_of: Callable[[int], int | None]) -> tuple[list[protocol.Target], list[int]]:
    """ADD/DETECT items for ``ids`` (a live process of each namespace's containers), and the
    ids none of whose containers has a live process there."""
    found: list[protocol.Target] = []
    missing: list[int] = []
    for pidns in ids:
        pid = live_pid(pidns, containers(pidns), snapshot, pidns_of)
        if pid is None:
            missing.append(pidns)
        else:
            found.append(protocol.Target(pidns, pid))
    return found, missing


def target_statuses(sent: Sequence[Sequence[protocol.Target]],
                    replies: Sequence[protocol.Reply]) -> dict[int, int]:
    """pidns -> the kernel's status for each target, chunk by chunk; a refused message (no list)
    gives its status to every target in it."""
    statuses: dict[int, int] = {}
    for chunk, reply in zip(sent, replies, strict=True):
        listed = reply.statuses if len(reply.statuses) == len(chunk) else \
            (min(reply.header.status, 0) or -errno.EIO,) * len(chunk)  # fmt: skip
        statuses.update((t.pidns, status) for t, status in zip(chunk, listed, strict=True))
    return statuses


def failures_message(failed: dict[int, int]) -> str:
    return "; ".join(f"pid namespace {p}: {WHY.get(s, errno.errorcode.get(-s, str(s)))} ({s})"
                     for p, s in sorted(failed.items()))


def resend_plan(entries: Iterable[WatchEntry], kernel: dict[int, int]) -> tuple[list[int], list[int]]:
    """After a registration: (ADD ids, DETECT ids), given the kernel's flags of the namespaces it
    still has (a bridge restart, not a module reload). A detected namespace the kernel still has
    armed, or is still reclaiming, is only added: a DETECT now would arm a second notice (the
    notice of a reclaim in progress comes again by itself)."""
    add: list[int] = []
    detect: list[int] = []
    settled = protocol.F_NEED_NOTICE | protocol.F_RECLAIMING
    for entry in entries:
        again = entry.mode == "detected" and not kernel.get(entry.pidns, 0) & settled
        (detect if again else add).append(entry.pidns)
    return sorted(add), sorted(detect)


Who = tuple[str, str, str]  # pod key, container, role


def placed_of(placements: Sequence[events.Placement], owners: Mapping[int, Owned]
              ) -> dict[int, events.Placement]:
    """pidns -> the placement the command gives the container living there (``ns/pod/container``)."""
    by_key = {p.container: p for p in placements}
    return {pidns: by_key[key] for pidns, (pod, container, _) in owners.items()
            if (key := f"{pod}/{container}") in by_key}  # fmt: skip


def counted_only_message(entries: Iterable[WatchEntry]) -> str:
    return "; ".join(f"pid namespace {e.pidns} ({e.pod}/{e.container}) is a {e.role}'s: counted only, "
                     "never detected or held" for e in entries)  # fmt: skip


def namespace_stats(record: protocol.StatsRecord, who: Who) -> events.NamespaceStats:
    pod, container, role = who
    return events.NamespaceStats(
        pidns=record.pidns, watched=bool(record.flags & protocol.F_WATCHED),
        need_notice=bool(record.flags & protocol.F_NEED_NOTICE), blocked=record.blocked,
        last_access_ns=record.last_access_ns, hits=record.hits, notices=record.notices, pod=pod,
        container=container, role=role,
    )


def reply_event(node: str, op: str, status: int, ids: Sequence[int], timing: HoldTiming, message: str = "",
                replies: Sequence[protocol.Reply] = (),
                who_of: Callable[[int], Who] = lambda _: ("", "", ""),
                unresolved: Sequence[str] = ()) -> events.KmodReply:
    """The answer to a command; every answer carries the kernel's hold parameters as last known
    (``timing``), so that the solver learns them from the kernel too."""
    records = [r for reply in replies for r in reply.stats]
    heads = [reply.stats_head for reply in replies if reply.stats_head is not None]
    return events.KmodReply(
        node=node, op=op, status=status, message=message, pidns=tuple(ids),
        stats=tuple(namespace_stats(r, who_of(r.pidns)) for r in records),
        kernel_now_ns=heads[-1].now_ns if heads else 0,
        timeout_ms=timing.timeout_ms if timing.known else 0, max_hold_ms=timing.max_hold_ms if timing.known else 0,
        unresolved=tuple(unresolved),
    )


def stats_view(reply: protocol.Reply | None, pod_of: Callable[[int], str]) -> dict[str, object]:
    """The last STATS reply as the /status page shows it."""
    if reply is None or reply.stats_head is None:
        return {"kernel": None}
    head = reply.stats_head
    return {"kernel": {
        "entries": head.entries, "max_entries": head.max_entries,
        "notices_sent": head.notices_sent, "notices_dropped": head.notices_dropped,
        "receiver_portid": head.receiver_portid, "timeout_ms": head.timeout_ms,
        "max_hold_ms": head.max_hold_ms,
        "namespaces": [
            {"pidns": r.pidns, "pod": pod_of(r.pidns), "flags": flag_names(r.flags),
             "blocked": r.blocked, "hits": r.hits, "notices": r.notices,
             "releases": r.releases, "timeouts": r.timeouts, "holds": r.holds}
            for r in reply.stats
        ],
    }}


def flag_names(flags: int) -> list[str]:
    names = ((protocol.F_WATCHED, "watched"), (protocol.F_NEED_NOTICE, "need_notice"),
             (protocol.F_RECLAIMING, "reclaiming"))
    return [name for bit, name in names if flags & bit]
