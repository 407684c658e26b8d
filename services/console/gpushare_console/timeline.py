"""The eviction timeline: eviction records grouped by the event that caused them, each owner-back
with its hops.

An :class:`~gpushare_common.events.EvictionRecord` names its trigger (``trigger_id``: for an
owner-back noticed by the kernel, the :class:`~gpushare_common.events.OwnerBackEvent`'s id).
The hops of an owner-back, in milliseconds from the kernel's notice (from the solver's handling
when no notice is known, e.g. an owner back by utilisation):

- ``notice``: the kernel saw the owner's GPU call (0);
- ``published``: the kmod-bridge's owner-back event reached NATS (``notice_to_publish_ms``);
- ``handled``: the solver took it (the record's time less ``total_ms``);
- ``tasks_dead``: every task of the borrowers had exited (``tasks_dead_ms``);
- ``released``: the owner's release was sent (``released_ms``);
- ``evicted``: the last borrower was deleted and recorded (``total_ms``).

The clocks of the kmod-bridge and the solver are the same node's wall clock.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import msgspec
from gpushare_common.events import EvictionRecord, OwnerBackEvent

OWNER_BACK = "owner-back"


class Timeline:
    """The newest ``keep`` owner-backs and eviction records (older ones are forgotten)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.owner_backs: OrderedDict[str, OwnerBackEvent] = OrderedDict()
        self.records: OrderedDict[str, EvictionRecord] = OrderedDict()

    def add(self, event: OwnerBackEvent | EvictionRecord) -> None:
        book: OrderedDict[str, Any] = self.owner_backs if isinstance(event, OwnerBackEvent) else self.records
        book[event.id] = event
        book.move_to_end(event.id)
        while len(book) > self.keep:
            book.popitem(last=False)

    def entries(self) -> list[dict[str, Any]]:
        """Newest first: one entry per trigger (its evictions) and per owner-back without any."""
        groups: dict[str, list[EvictionRecord]] = {}
        for record in self.records.values():
            groups.setdefault(record.trigger_id or record.id, []).append(record)
        entries = [entry(trigger, records, self.owner_backs.get(trigger)) for trigger, records in groups.items()]
        entries += [entry(ob.id, [], ob) for ob in self.owner_backs.values() if ob.id not in groups]
        return sorted(entries, key=lambda e: e["at"], reverse=True)


def entry(trigger: str, records: list[EvictionRecord], owner_back: OwnerBackEvent | None) -> dict[str, Any]:
    reasons = sorted({r.reason for r in records}) or [OWNER_BACK]
    handled = min((r.ts - r.total_ms / 1000 for r in records), default=owner_back.ts if owner_back else 0.0)
    return {
        "trigger": trigger,
        "node": records[0].node if records else owner_back.node if owner_back else "",
        "reason": ",".join(reasons),
        "owner": next((r.owner for r in records if r.owner), owner_back.pod if owner_back else ""),
        "at": handled,
        "owner_back": msgspec.structs.asdict(owner_back) if owner_back else None,
        "hops": hops(records, owner_back, handled) if OWNER_BACK in reasons else [],
        "evictions": [_record_view(r) for r in sorted(records, key=lambda r: r.pod)],
    }


def hops(records: list[EvictionRecord], owner_back: OwnerBackEvent | None, handled: float) -> list[dict[str, Any]]:
    """The owner-back's hops, ``at_ms`` from the kernel's notice (or the handling)."""
    found: list[tuple[str, float]] = []
    start = 0.0
    if owner_back is not None:
        published = owner_back.notice_to_publish_ms
        start = published + max(0.0, handled - owner_back.ts) * 1000
        found += [("notice", 0.0), ("published", published)]
    found.append(("handled", start))
    if records:
        dead = max(r.tasks_dead_ms for r in records)
        released = max(r.released_ms for r in records)
        found += [("tasks_dead", start + dead)] if dead else []
        found += [("released", start + released)] if released else []
        found.append(("evicted", start + max(r.total_ms for r in records)))
    return [{"hop": name, "at_ms": round(at, 3)} for name, at in found]


def _record_view(record: EvictionRecord) -> dict[str, Any]:
    keys = ("pod", "reason", "owner", "outcome", "error", "kill_ms", "delete_ms", "total_ms", "tasks_dead_ms",
            "released_ms", "containers", "ts", "id")  # fmt: skip
    return {key: getattr(record, key) for key in keys}
