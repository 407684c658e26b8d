"""One reconcile pass: records in, decisions out (pure; the clock is an argument).

Per quota key (namespace, kind, N) and placement (the nodes a SharePod may run on, see
:mod:`.placement`): ``pipelining`` = -(devices wanted by pending SharePods of that placement);
``ready`` = free devices of live ShadowPods that serve the placement, plus N for each such
ShadowPod created but not yet Running (also those this controller created and has not seen yet),
minus bound SharePods not yet attributed to a ShadowPod (taken from the ShadowPods on their node);
``releasing`` = devices of terminating ShadowPods.  Short of devices: create ``ceil(-delta / N)``
for that placement.  A ShadowPod with no user for the idle timeout, while nothing it could serve
is pending, is deleted; never one in use.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpushare_common.mapping import QuotaKey, ShareDeviceCount

from .model import Record, ShadowPod, SharePod
from .placement import ANYWHERE, Placement


@dataclass(frozen=True, slots=True)
class Create:
    quota: QuotaKey
    count: int
    reason: str
    placement: Placement = ANYWHERE


@dataclass(slots=True)
class Supply:
    """Free virtual devices of one ShadowPod (live, or created and not seen yet)."""

    quota: QuotaKey
    placement: Placement
    node: str
    free: int


@dataclass(frozen=True, slots=True)
class Delete:
    shadow: str
    quota: QuotaKey
    reason: str


@dataclass(slots=True)
class Plan:
    counts: dict[QuotaKey, ShareDeviceCount] = field(default_factory=dict)
    creates: list[Create] = field(default_factory=list)
    deletes: list[Delete] = field(default_factory=list)
    users: dict[str, int] = field(default_factory=dict)


def plan(
    records: Iterable[Record],
    expected: Mapping[str, tuple[QuotaKey, Placement]],
    idle_since: dict[str, float],
    now: float,
    idle_timeout_s: float,
) -> Plan:
    """Decide creations and deletions; updates ``idle_since`` in place."""
    shares: list[SharePod] = []
    shadows: list[ShadowPod] = []
    for record in records:
        if isinstance(record, SharePod):
            shares.append(record)
        else:
            shadows.append(record)
    owners = Counter(s.owner for s in shares if s.active and s.owner)
    unattributed: Counter[tuple[str, QuotaKey]] = Counter()
    pending: Counter[tuple[QuotaKey, Placement]] = Counter()
    for share in shares:
        if share.pending:
            pending[(share.quota, share.placement)] += share.count
        elif share.active and not share.owner:
            unattributed[(share.node, share.quota)] += share.count
    supply: list[Supply] = []
    releasing: Counter[QuotaKey] = Counter()
    result = Plan()
    seen = set()
    for shadow in shadows:
        seen.add(shadow.key)
        used = max(owners.get(shadow.key, 0), shadow.using)
        result.users[shadow.key] = used
        # users known only from Using conditions are bound SharePods whose owner annotation is
        # not written yet: they are counted here, so they must not count as unattributed too
        _attribute(unattributed, (shadow.node, shadow.quota), used - owners.get(shadow.key, 0))
        if shadow.terminating:
            releasing[shadow.quota] += shadow.quota.spec
        elif shadow.phase == "Running":
            supply.append(Supply(shadow.quota, shadow.placement, shadow.node, max(0, shadow.quota.spec - used)))
        elif shadow.phase == "Pending":
            supply.append(Supply(shadow.quota, shadow.placement, shadow.node, shadow.quota.spec))
    for name, (quota, placement) in expected.items():
        if name not in seen:
            supply.append(Supply(quota, placement, "", quota.spec))
    debt = _take_unattributed(supply, unattributed)
    for quota in {q for q, _ in pending} | {s.quota for s in supply} | set(releasing):
        free = sum(s.free for s in supply if s.quota == quota) - debt[quota]
        wanted = sum(n for (q, _), n in pending.items() if q == quota)
        result.counts[quota] = ShareDeviceCount(pipelining=-wanted, ready=free, releasing=releasing[quota])
    for (quota, placement), wanted in sorted(pending.items(), key=lambda kv: (kv[0][0].resource, kv[0][1].text)):
        free = sum(s.free for s in supply if s.quota == quota and s.placement.serves(placement, s.node))
        count = ShareDeviceCount(pipelining=-wanted, ready=free - debt[quota], releasing=releasing[quota])
        to_create = count.shadow_pods_to_create(quota.spec)
        if to_create:
            where = "" if placement.anywhere else f" on {placement.hostname or placement.text}"
            result.creates.append(Create(quota, to_create, f"{wanted} devices pending{where}, {max(free, 0)} free",
                                         placement))  # fmt: skip
    result.deletes = _idle(shadows, result.users, unattributed, pending, idle_since, now, idle_timeout_s)
    return result


def _take_unattributed(supply: list[Supply], unattributed: Counter[tuple[str, QuotaKey]]) -> Counter[QuotaKey]:
    """Bound SharePods not attributed to a ShadowPod yet use devices of a ShadowPod on their node:
    take them from those; what no ShadowPod on the node has is owed by the quota key as a whole."""
    debt: Counter[QuotaKey] = Counter()
    for (node, quota), devices in unattributed.items():
        for entry in supply:
            if devices and entry.quota == quota and entry.node == node and node:
                taken = min(entry.free, devices)
                entry.free -= taken
                devices -= taken
        debt[quota] += devices
    return debt


def _attribute(unattributed: Counter[tuple[str, QuotaKey]], where: tuple[str, QuotaKey], known: int) -> None:
    left = unattributed.get(where, 0) - max(0, known)
    if left > 0:
        unattributed[where] = left
    else:
        unattributed.pop(where, None)


def _idle(
    shadows: list[ShadowPod], users: dict[str, int], unattributed: Counter[tuple[str, QuotaKey]],
    pending: Counter[tuple[QuotaKey, Placement]], idle_since: dict[str, float], now: float, timeout: float,
) -> list[Delete]:
    deletes = []
    live = {s.key for s in shadows}
    for key in list(idle_since):
        if key not in live:
            del idle_since[key]
    busy_nodes: defaultdict[QuotaKey, set[str]] = defaultdict(set)
    for node, quota in unattributed:
        busy_nodes[quota].add(node)
    for shadow in shadows:
        in_use = users[shadow.key] > 0 or shadow.node in busy_nodes[shadow.quota]
        if shadow.terminating or in_use:
            idle_since.pop(shadow.key, None)
            continue
        since = idle_since.setdefault(shadow.key, now)
        wanted = any(q == shadow.quota and shadow.placement.serves(p, shadow.node) for q, p in pending)
        if now - since >= timeout and not wanted:
            deletes.append(Delete(shadow.key, shadow.quota, f"no user for {now - since:.0f}s"))
    return deletes
