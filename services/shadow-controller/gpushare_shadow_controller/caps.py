"""Whether each SharePod's hard caps hold, from its ShadowPod's state (pure).

A ShadowPod capped with NVIDIA MPS (annotation ``gpushare.k8s.io/isolation: mps``)
runs the MPS control daemon in ``main`` and is Ready only while the daemon
answers its readiness probe.  Its SharePods' caps (pinned device memory, active
thread percentage) exist only through that daemon: a CUDA process that starts
while it is down finds no daemon and runs without MPS, uncapped, and the
processes of a daemon that died lose their MPS server.  Nothing fails loudly,
so the controller says it on every SharePod using the ShadowPod's devices:

- the ShadowPod is Running but not Ready: the pod condition
  ``gpushare.k8s.io/CapsEnforced`` False, reason ``MPSDaemonDown``, and a
  Warning Event ``CapsNotEnforced`` naming the ShadowPod and its card;
- Ready again: the condition True, reason ``MPSDaemonUp``, and a Normal Event
  ``CapsEnforced``;
- ``main`` restarted (its restart count rose) and the ShadowPod is Ready again
  before the pod was told it was down: the condition True, reason
  ``MPSDaemonRestarted``, and a Warning Event ``CapsNotEnforced``.

A SharePod holds a capped ShadowPod's devices only if that ShadowPod was Ready
(the device plugin advertises them only then), so "had been Ready" needs no
memory of its own.  The condition records what the SharePod was told, so a
later pass, a restarted controller or a new leader repeats nothing.  Restart
counts are compared with the last count this replica saw: the first sight is
the baseline, so a restart while no replica watched is told only when the
ShadowPod is still not Ready.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpushare_common.isolation import MPS

from .model import Record, ShadowPod, SharePod

DOWN = "MPSDaemonDown"
UP = "MPSDaemonUp"
RESTARTED = "MPSDaemonRestarted"
EVENT_NOT_ENFORCED = "CapsNotEnforced"
EVENT_ENFORCED = "CapsEnforced"


@dataclass(frozen=True, slots=True)
class CapsReport:
    """Set one SharePod's CapsEnforced condition and record an Event on it."""

    pod: str
    uid: str
    shadow: str
    enforced: bool  # the condition's status
    reason: str  # the condition's reason: MPSDaemonDown | MPSDaemonUp | MPSDaemonRestarted
    message: str
    transition: bool  # the condition's status changes (its lastTransitionTime moves)

    @property
    def warning(self) -> bool:
        return self.reason != UP

    @property
    def event_reason(self) -> str:
        return EVENT_NOT_ENFORCED if self.warning else EVENT_ENFORCED


@dataclass(slots=True)
class CapsPlan:
    reports: list[CapsReport] = field(default_factory=list)
    restarts: dict[str, int] = field(default_factory=dict)  # restart counts: the next pass's baseline
    down: list[str] = field(default_factory=list)  # MPS ShadowPods Running without a Ready daemon
    not_enforced: list[str] = field(default_factory=list)  # SharePods whose caps do not hold now


def plan_caps(records: Iterable[Record], told: Mapping[str, str], restarts_seen: Mapping[str, int]) -> CapsPlan:
    """What to tell which SharePod. ``told``: SharePod -> the CapsEnforced status this controller
    wrote and the watch may not show yet (it wins over the record's); ``restarts_seen``: MPS
    ShadowPod -> the restart count of ``main`` at the last pass."""
    shadows: dict[str, ShadowPod] = {}
    shares: dict[str, SharePod] = {}
    for record in records:
        if isinstance(record, SharePod):
            shares[record.key] = record
        elif record.isolation == MPS:
            shadows[record.key] = record
    result = CapsPlan()
    if not shadows:
        return result
    users: dict[str, dict[str, SharePod]] = {key: {} for key in shadows}
    for share in shares.values():
        if share.owner in users:
            users[share.owner][share.key] = share
    for shadow in shadows.values():
        for key in shadow.users:
            if key in shares:
                users[shadow.key].setdefault(key, shares[key])
    for key, shadow in sorted(shadows.items()):
        result.restarts[key] = shadow.restarts
        if shadow.terminating or shadow.phase != "Running":
            continue  # starting, or going: its SharePods are evicted with it
        restarted = key in restarts_seen and shadow.restarts > restarts_seen[key]
        if not shadow.ready:
            result.down.append(key)
        for share in sorted(users[key].values(), key=lambda s: s.key):
            if not share.active or share.opted_out:
                continue
            report = _report(shadow, share, told.get(share.key, share.caps), restarted)
            if not shadow.ready:
                result.not_enforced.append(share.key)
            if report is not None:
                result.reports.append(report)
    return result


def _report(shadow: ShadowPod, share: SharePod, state: str, restarted: bool) -> CapsReport | None:
    card = f"{shadow.card or 'its card'} on node {shadow.node or '?'}"
    restart = f", main restarted ({shadow.restarts} restarts)" if restarted else ""
    if not shadow.ready:
        if state == "False":
            return None
        message = (f"the MPS control daemon of ShadowPod {shadow.key} ({card}) is down{restart}: this "
                   "pod's memory and compute caps are not enforced; CUDA processes started now run "
                   "without them")
        return CapsReport(share.key, share.uid, shadow.key, False, DOWN, message, True)
    if state == "False":
        message = (f"the MPS control daemon of ShadowPod {shadow.key} ({card}) is up again: caps hold for "
                   "CUDA processes started from now on; those started while it was down stay uncapped "
                   "until they restart")
        return CapsReport(share.key, share.uid, shadow.key, True, UP, message, True)
    if restarted:
        message = (f"the MPS control daemon of ShadowPod {shadow.key} ({card}) restarted ({shadow.restarts} "
                   "restarts) and is up again: CUDA processes of this pod that ran or started meanwhile "
                   "may be without their caps until they restart")
        return CapsReport(share.key, share.uid, shadow.key, True, RESTARTED, message, state != "True")
    return None
