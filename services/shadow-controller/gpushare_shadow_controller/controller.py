"""The controller's state and its reconcile step: watch records in, ShadowPods created or retired,
SharePods told when their MPS caps do not hold (:mod:`.caps`)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from gpushare_common import ids
from gpushare_common.adapters.kube import Kube, KubeError, NotFound, PodChange
from gpushare_common.kubeevents import pod_event, rfc3339
from gpushare_common.logging import get_logger
from gpushare_common.mapping import QuotaKey
from gpushare_common.pods import SYSTEM_NAMESPACE, PodRules
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .caps import CapsPlan, CapsReport, plan_caps
from .model import Record, ShadowPod, SharePod, classify
from .placement import ANYWHERE, Placement
from .planner import Plan, plan
from .settings import ShadowSettings
from .template import shadow_name, shadow_pod

log = get_logger("shadow-controller")


@dataclass(frozen=True, slots=True)
class Decision:
    at: float
    action: str  # create | delete | error
    target: str
    quota: str
    reason: str


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.created = Counter("gpushare_shadowpods_created", "ShadowPods created", registry=registry)
        self.deleted = Counter("gpushare_shadowpods_deleted", "ShadowPods retired", registry=registry)
        self.errors = Counter("gpushare_shadow_write_errors", "Failed writes", registry=registry)
        self.passes = Histogram("gpushare_shadow_reconcile_seconds", "Reconcile pass time",
                                registry=registry, buckets=(0.001, 0.005, 0.02, 0.05, 0.1, 0.2, 0.5, 1))
        self.leader = Gauge("gpushare_shadow_leader", "1 when this replica leads", registry=registry)
        self.caps_reports = Counter("gpushare_shadow_caps_reports",
                                    "SharePods told whether their MPS caps hold (CapsEnforced condition "
                                    "and Event), by the condition's reason", ["reason"], registry=registry)
        self.mps_down = Gauge("gpushare_shadow_mps_daemons_down",
                              "MPS ShadowPods Running without a Ready control daemon", registry=registry)
        self.caps_not_enforced = Gauge("gpushare_shadow_caps_not_enforced",
                                       "SharePods whose MPS caps do not hold now", registry=registry)


class Controller:
    def __init__(self, kube: Kube, settings: ShadowSettings, registry: CollectorRegistry,
                 is_leader: Callable[[], bool], clock: Callable[[], float] = time.time,
                 system_namespace: str = SYSTEM_NAMESPACE) -> None:  # fmt: skip
        self.kube, self.settings, self.is_leader, self.clock = kube, settings, is_leader, clock
        self.rules = PodRules(domain=settings.domain, vendor_resources=(settings.vendor_resource,),
                              system_namespace=system_namespace)
        self.records: dict[str, Record] = {}
        self.expected: dict[str, tuple[QuotaKey, Placement, float]] = {}  # created, not seen yet
        self.idle_since: dict[str, float] = {}
        self.decisions: deque[Decision] = deque(maxlen=50)
        self.last_plan = Plan()
        self.metrics = Metrics(registry)
        self.dirty = asyncio.Event()
        self.passes = 0
        self.caps_told: dict[str, tuple[str, float]] = {}  # SharePod -> CapsEnforced written, when
        self.caps_restarts: dict[str, int] = {}  # MPS ShadowPod -> restart count of main last pass
        self.last_caps = CapsPlan()

    # --- state from the watch ----------------------------------------------------

    def apply(self, change: PodChange, namespace: str | None = None) -> None:
        """Fold one watch change in; a SYNC replaces the records of ``namespace`` (all if None)."""
        if change.kind == "SYNC":
            kept = {k: v for k, v in self.records.items()
                    if namespace is not None and not k.startswith(namespace + "/")}
            for pod in change.pods:
                record = classify(pod, self.rules)
                if record is not None:
                    kept[record.key] = record
                    self.expected.pop(record.key, None)
            self.records = kept
        elif change.pod is not None:
            meta = change.pod.get("metadata") or {}
            key = ids.pod_key(meta.get("namespace", ""), meta.get("name", ""))
            record = None if change.kind == "DELETED" else classify(change.pod, self.rules)
            if record is None:
                self.records.pop(key, None)
            else:
                self.records[key] = record
            self.expected.pop(key, None)
        self.dirty.set()

    # --- one pass -----------------------------------------------------------------

    def decide(self) -> Plan:
        now = self.clock()
        for name, (_quota, _placement, at) in list(self.expected.items()):
            if now - at > self.settings.expected_ttl_s:
                del self.expected[name]
        expected = {name: (quota, placement) for name, (quota, placement, _at) in self.expected.items()}
        self.last_plan = plan(self.records.values(), expected, self.idle_since, now,
                              self.settings.idle_timeout_s)
        return self.last_plan

    async def reconcile(self) -> Plan:
        with self.metrics.passes.time():
            result = self.decide()
        self.passes += 1
        self.metrics.leader.set(1 if self.is_leader() else 0)
        for create in result.creates:
            for _ in range(create.count):
                if not await self._create(create.quota, create.reason, create.placement):
                    break
        for delete in result.deletes:
            await self._delete(delete.shadow, delete.quota, delete.reason)
        await self._report_caps()
        return result

    async def _report_caps(self) -> None:
        now = self.clock()
        for key, (status, at) in list(self.caps_told.items()):  # until the watch shows it (or for a while)
            record = self.records.get(key)
            if not isinstance(record, SharePod) or record.caps == status or now - at > self.settings.expected_ttl_s:
                del self.caps_told[key]
        told = {key: status for key, (status, _at) in self.caps_told.items()}
        caps = plan_caps(self.records.values(), told, self.caps_restarts)
        self.caps_restarts = caps.restarts
        self.last_caps = caps
        self.metrics.mps_down.set(len(caps.down))
        self.metrics.caps_not_enforced.set(len(caps.not_enforced))
        for report in caps.reports:
            if not self.is_leader():
                return
            await self._tell(report)

    async def _tell(self, report: CapsReport) -> None:
        """The SharePod's CapsEnforced condition, then an Event on it (only once the condition is
        written, so a failed write is retried whole by the next pass)."""
        namespace, name = ids.parse_pod_key(report.pod)
        at = time.time()
        condition = {"type": ids.CONDITION_CAPS_ENFORCED, "status": "True" if report.enforced else "False",
                     "reason": report.reason, "message": report.message}
        if report.transition:
            condition["lastTransitionTime"] = rfc3339(at)
        try:
            await self.kube.patch_pod_status(namespace, name, {"status": {"conditions": [condition]}},
                                             strategic=True)
        except NotFound:
            return
        except KubeError as err:
            self.metrics.errors.inc()
            log.warning("CapsEnforced condition not written", pod=report.pod, shadow=report.shadow,
                        error=str(err))
            return
        self.caps_told[report.pod] = (condition["status"], self.clock())
        self.metrics.caps_reports.labels(report.reason).inc()
        say = log.warning if report.warning else log.info
        say("caps not enforced" if report.warning else "caps enforced again", pod=report.pod,
            shadow=report.shadow, reason=report.reason)
        try:
            await self.kube.create_event(namespace, caps_event(report, namespace, name, at, self.settings.who()))
        except KubeError as err:
            self.metrics.errors.inc()
            log.warning("caps event not recorded", pod=report.pod, reason=report.event_reason, error=str(err))

    async def _create(self, quota: QuotaKey, reason: str, placement: Placement = ANYWHERE) -> bool:
        if not self.is_leader():
            return False
        name = shadow_name(quota)
        try:
            await self.kube.create_pod(quota.namespace, shadow_pod(quota, name, self.settings, placement))
        except KubeError as err:
            self._decide("error", f"{quota.namespace}/{name}", quota, f"create failed: {err}")
            self.metrics.errors.inc()
            return False
        self.expected[ids.pod_key(quota.namespace, name)] = (quota, placement, self.clock())
        self.metrics.created.inc()
        self._decide("create", ids.pod_key(quota.namespace, name), quota, reason)
        return True

    async def _delete(self, key: str, quota: QuotaKey, reason: str) -> None:
        record = self.records.get(key)
        if not self.is_leader() or not isinstance(record, ShadowPod):
            return
        namespace, name = ids.parse_pod_key(key)
        try:
            await self.kube.delete_pod(namespace, name, grace_seconds=0)
        except NotFound:
            pass
        except KubeError as err:
            self._decide("error", key, quota, f"delete failed: {err}")
            self.metrics.errors.inc()
            return
        record.terminating = True
        self.idle_since.pop(key, None)
        self.metrics.deleted.inc()
        self._decide("delete", key, quota, reason)

    def _decide(self, action: str, target: str, quota: QuotaKey, reason: str) -> None:
        self.decisions.append(Decision(self.clock(), action, target, quota.resource, reason))
        log.info(f"shadowpod {action}", pod=target, namespace=quota.namespace,
                 resource=quota.resource, reason=reason)

    # --- /status ------------------------------------------------------------------

    def caps_status(self) -> dict[str, Any]:
        return {"mps_daemons_down": self.last_caps.down, "not_enforced": self.last_caps.not_enforced}

    def status(self) -> dict[str, Any]:
        counts = {
            f"{q.namespace}/{q.resource}": {"pipelining": c.pipelining, "ready": c.ready,
                                            "releasing": c.releasing, "delta": c.delta}
            for q, c in sorted(self.last_plan.counts.items(), key=lambda kv: str(kv[0]))
        }
        shadows = {k: {"node": r.node, "phase": r.phase, "terminating": r.terminating,
                       "users": self.last_plan.users.get(k, 0), "idle_since": self.idle_since.get(k)}
                   for k, r in self.records.items() if isinstance(r, ShadowPod)}
        return {"leader": self.is_leader(), "quota": counts, "shadow_pods": shadows,
                "pending_creations": sorted(self.expected),
                "decisions": [asdict(d) for d in self.decisions], "caps": self.caps_status()}


def caps_event(report: CapsReport, namespace: str, name: str, at: float, instance: str) -> dict[str, Any]:
    """A core/v1 Event on the SharePod, its ShadowPod as the related object."""
    return pod_event(namespace, name, uid=report.uid, reason=report.event_reason, message=report.message,
                     warning=report.warning, component="gpushare-shadow-controller", instance=instance,
                     related=ids.parse_pod_key(report.shadow), at=at)
