"""Sample the node's cgroups periodically and publish its spare CPU/memory as ``SpareCapacity``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpushare_common import events as ev
from gpushare_common.bus import BusError
from gpushare_common.logging import get_logger
from gpushare_common.pods import PodKind
from gpushare_common.retry import wait_for_stop
from gpushare_common.subjects import Subjects

from .adapters.cgroups import PodsUsage, read_node, read_pods
from .capacity import Inputs, Policy, Spare, should_publish, spare, usage_moved, zero
from .cgroupstats import NodeStats, StatsError
from .metrics import DetectorMetrics
from .pods import PodTracker
from .settings import DetectorSettings

log = get_logger("detector.capacity")
RESOURCES = ("vcpu", "vmem")


class Publisher(Protocol):
    subjects: Subjects

    async def publish_persistent(self, subject: str, event: ev.Event) -> int: ...


@dataclass(frozen=True, slots=True)
class Snapshot:
    at: float
    node: NodeStats
    pods: PodsUsage


def _rate_millicores(before_ns: int, after_ns: int, seconds: float) -> float:
    return max(0.0, (after_ns - before_ns) / seconds / 1e6) if seconds > 0 else 0.0


def compute(before: Snapshot, after: Snapshot, batch_uids: set[str], policy: Policy) -> dict[str, Spare]:
    """Both resources' spare capacity from two snapshots (CPU is a rate between them)."""
    seconds = after.at - before.at
    cpu = {uid: _rate_millicores(before.pods.pods[uid].cpu_ns, u.cpu_ns, seconds)
           for uid, u in after.pods.pods.items() if uid in before.pods.pods}
    memory = {uid: float(u.memory) for uid, u in after.pods.pods.items()}
    cpu_inputs = Inputs(
        total=after.node.cpus * 1000.0,
        node_used=_rate_millicores(before.node.cpu_busy_ns, after.node.cpu_busy_ns, seconds),
        pods_used=sum(cpu.values()),
        ordinary_used=sum(v for uid, v in cpu.items() if uid not in batch_uids),
        reserved=policy.reserved_millicores)
    memory_inputs = Inputs(
        total=float(after.node.memory_total), node_used=float(after.node.memory_used),
        pods_used=sum(memory.values()),
        ordinary_used=sum(v for uid, v in memory.items() if uid not in batch_uids),
        reserved=policy.reserved_memory_bytes)
    result = {"vcpu": spare("vcpu", cpu_inputs, policy.margin_ratio),
              "vmem": spare("vmem", memory_inputs, policy.margin_ratio)}
    for found in result.values():  # both sides of the node, so the solver can judge pressure
        found.inputs.update(node_cpu_total_m=cpu_inputs.total, node_cpu_used_m=cpu_inputs.node_used,
                            node_memory_total=memory_inputs.total, node_memory_used=memory_inputs.node_used,
                            pods=float(len(after.pods.pods)))
    return result


class CapacityService:
    def __init__(self, node: str, policy: Policy, bus: Publisher, tracker: PodTracker,
                 metrics: DetectorMetrics, sample: Callable[[], tuple[NodeStats, PodsUsage]],
                 every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self.policy = policy
        self.bus = bus
        self.tracker = tracker
        self.metrics = metrics
        self.sample = sample
        self.every_s = every_s
        self.clock = clock
        self.previous: Snapshot | None = None
        self.last_good: float | None = None
        self.current: dict[str, Spare] = {}
        self.published: dict[str, tuple[int, float, dict[str, float]]] = {}  # devices, when, inputs
        self.error = ""

    @classmethod
    def build(cls, node: str, settings: DetectorSettings, bus: Publisher, tracker: PodTracker,
              metrics: DetectorMetrics) -> CapacityService:
        policy = Policy(settings.safety_margin_ratio, settings.reserved_millicores,
                        settings.reserved_memory_bytes, settings.capacity_change_ratio,
                        settings.capacity_republish_s, settings.capacity_stale_s,
                        settings.capacity_usage_step)
        cgroups, proc = Path(settings.cgroup_root), Path(settings.proc_root)
        return cls(node, policy, bus, tracker, metrics, lambda: (read_node(proc), read_pods(cgroups)),
                   settings.capacity_s)

    def batch_uids(self) -> set[str]:
        return {v.uid for v in self.tracker.views.values() if v.kind is PodKind.BATCH}

    async def tick(self) -> None:
        now = self.clock()
        try:
            node, pods = await asyncio.to_thread(self.sample)
        except StatsError as err:
            self.metrics.errors.labels("cgroups", "unreadable").inc()
            self.error = str(err)
        else:
            self.error = ""
            snapshot = Snapshot(now, node, pods)
            if self.previous is not None:
                self.current = compute(self.previous, snapshot, self.batch_uids(), self.policy)
                self.last_good = now
            self.previous = snapshot
        if self.last_good is not None and now - self.last_good > self.policy.stale_s:
            self.current = {r: zero(r, now - self.last_good) for r in RESOURCES}
        await self.publish(now)

    async def publish(self, now: float) -> None:
        for resource, found in self.current.items():
            previous, at, inputs = self.published.get(resource, (None, 0.0, {}))
            self.metrics.spare.labels(resource).set(found.devices)
            if not should_publish(previous, found.devices, now - at, self.policy) and \
                    not usage_moved(inputs, found.inputs, self.policy.usage_step):
                continue
            event = ev.SpareCapacity(node=self.node, resource=resource, devices=found.devices,
                                     unit=found.unit, inputs=found.inputs)
            try:
                await self.bus.publish_persistent(self.bus.subjects.capacity(self.node, resource), event)
            except BusError as err:  # try again on the next tick
                self.metrics.publish_failures.inc()
                log.warning("spare capacity not published", node=self.node, resource=resource, error=repr(err))
                continue
            self.published[resource] = (found.devices, now, dict(found.inputs))
            if previous != found.devices:
                log.info("spare capacity changed", node=self.node, resource=resource, devices=found.devices)

    async def loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.tick()
            await wait_for_stop(stop, self.every_s)

    def status(self) -> dict[str, Any]:
        return {
            "error": self.error,
            "age_s": None if self.last_good is None else round(self.clock() - self.last_good, 1),
            "resources": {r: {"devices": s.devices, "unit": s.unit, "inputs": s.inputs}
                          for r, s in self.current.items()},
        }
