"""Pure functions of the bridge: commands to kernel operations, kernel answers to events."""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence

import gpushare_common.events as events

from . import protocol
from .resolver import Owner, Snapshot
from .watchset import WatchEntry

ENOTCONN = -errno.ENOTCONN
ENOENT = -errno.ENOENT
EINVAL = -errno.EINVAL

KERNEL_OPS: dict[str, int] = {
    "add": protocol.CMD_ADD,
    "delete": protocol.CMD_DELETE,
    "detect": protocol.CMD_DETECT,
    "undetect": protocol.CMD_UNDETECT,
    "release": protocol.CMD_RELEASE,
    "stats": protocol.CMD_STATS,
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


def owner_back(node: str, notice: protocol.Notice, pod: str, container: str,
               publish_ns: int) -> events.OwnerBackEvent:
    return events.OwnerBackEvent(
        node=node, pidns=notice.pidns, pid=notice.pid, kernel_ts_ns=notice.ts_ns,
        pod=pod, container=container, resolved=bool(pod),
        notice_to_publish_ms=max(0.0, (publish_ns - notice.ts_ns) / 1e6),
    )


def namespace_stats(record: protocol.StatsRecord, pod: str) -> events.NamespaceStats:
    return events.NamespaceStats(
        pidns=record.pidns, watched=bool(record.flags & protocol.F_WATCHED),
        need_notice=bool(record.flags & protocol.F_NEED_NOTICE), blocked=record.blocked,
        last_access_ns=record.last_access_ns, hits=record.hits, notices=record.notices, pod=pod,
    )


def reply_event(node: str, op: str, status: int, ids: Sequence[int], message: str = "",
                replies: Sequence[protocol.Reply] = (),
                pod_of: Callable[[int], str] = lambda _: "") -> events.KmodReply:
    records = [r for reply in replies for r in reply.stats]
    heads = [reply.stats_head for reply in replies if reply.stats_head is not None]
    return events.KmodReply(
        node=node, op=op, status=status, message=message, pidns=tuple(ids),
        stats=tuple(namespace_stats(r, pod_of(r.pidns)) for r in records),
        kernel_now_ns=heads[-1].now_ns if heads else 0,
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
        "namespaces": [
            {"pidns": r.pidns, "pod": pod_of(r.pidns), "flags": flag_names(r.flags),
             "blocked": r.blocked, "hits": r.hits, "notices": r.notices,
             "releases": r.releases, "timeouts": r.timeouts}
            for r in reply.stats
        ],
    }}


def flag_names(flags: int) -> list[str]:
    names = ((protocol.F_WATCHED, "watched"), (protocol.F_NEED_NOTICE, "need_notice"),
             (protocol.F_RECLAIMING, "reclaiming"))
    return [name for bit, name in names if flags & bit]
