"""One reconcile pass: records in, decisions out (pure; the clock is an argument).

Per quota key (namespace, kind, N): ``pipelining`` = -(devices wanted by
pending SharePods); ``ready`` = free devices of live ShadowPods, plus N for
each ShadowPod created but not yet Running (also those this controller
created and has not seen yet), minus bound SharePods not yet attributed to
a ShadowPod; ``releasing`` = devices of terminating ShadowPods.  Short of
devices: create ``ceil(-delta / N)``.  A ShadowPod with no user for the idle
timeout, while nothing is pending for its key, is deleted; never one in use.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpushare_common.mapping import QuotaKey, ShareDeviceCount

from .model import Record, ShadowPod, SharePod


@dataclass(frozen=True, slots=True)
class Create:
    quota: QuotaKey
    count: int
    reason: str


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
    expected: Mapping[str, QuotaKey],
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
    pending: Counter[QuotaKey] = Counter()
    for share in shares:
        if share.pending:
            pending[share.quota] += share.count
        elif share.active and not share.owner:
            unattributed[(share.node, share.quota)] += share.count
    ready: Counter[QuotaKey] = Counter()
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
            ready[shadow.quota] += max(0, shadow.quota.spec - used)
        elif shadow.phase == "Pending":
            ready[shadow.quota] += shadow.quota.spec
    for name, quota in expected.items():
        if name not in seen:
            ready[quota] += quota.spec
    for (_node, quota), devices in unattributed.items():
        ready[quota] -= devices
    for quota in set(pending) | set(ready) | set(releasing):
        count = ShareDeviceCount(pipelining=-pending[quota], ready=ready[quota], releasing=releasing[quota])
        result.counts[quota] = count
        to_create = count.shadow_pods_to_create(quota.spec)
        if to_create:
            result.creates.append(Create(quota, to_create,
                                         f"{pending[quota]} devices pending, {max(ready[quota], 0)} free"))
    result.deletes = _idle(shadows, result.users, unattributed, pending, idle_since, now, idle_timeout_s)
    return result


def _attribute(unattributed: Counter[tuple[str, QuotaKey]], where: tuple[str, QuotaKey], known: int) -> None:
    left = unattributed.get(where, 0) - max(0, known)
    if left > 0:
        unattributed[where] = left
    else:
        unattributed.pop(where, None)


def _idle(
    shadows: list[ShadowPod], users: dict[str, int], unattributed: Counter[tuple[str, QuotaKey]],
    pending: Counter[QuotaKey], idle_since: dict[str, float], now: float, timeout: float,
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
        if now - since >= timeout and not pending[shadow.quota]:
            deletes.append(Delete(shadow.key, shadow.quota, f"no user for {now - since:.0f}s"))
    return deletes
