"""Pressure eviction wired to the detector's SpareCapacity events (see :mod:`.pressure`)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from gpushare_common.adapters.kube import KubeError
from gpushare_common.events import AnyEvent, SpareCapacity
from gpushare_common.logging import get_logger
from gpushare_common.pods import PodRules

from .nodepods import read_pods
from .ports import PodApi
from .pressure import (
    NodeUsage,
    OversoldPod,
    PressureInputError,
    PressurePolicy,
    choose_victims,
    oversold_pod,
)

log = get_logger("solver.pressure")
Evict = Callable[[str, dict[str, str], tuple[str, ...]], Awaitable[None]]  # trigger, pod -> uid, over


class PressureWatch:
    """On each capacity sample: if the node is under pressure, evict oversold pods."""

    def __init__(self, node: str, policy: PressurePolicy, pods: PodApi, evict: Evict,
                 clock: Callable[[], float] = time.monotonic, rules: PodRules | None = None) -> None:
        self.node, self.policy, self.pods, self.evict, self.clock = node, policy, pods, evict, clock
        self.rules = rules or PodRules()
        self.units: dict[str, float] = {}
        self.last_eviction: float | None = None
        self.last_usage: NodeUsage | None = None
        self.samples = 0
        self.evicted: list[str] = []  # the last pods evicted under pressure, in eviction order

    async def on_event(self, event: AnyEvent) -> None:
        if not isinstance(event, SpareCapacity):
            return
        self.units[event.resource] = float(event.unit)
        try:
            usage = NodeUsage.from_inputs(event.inputs)
        except PressureInputError as err:
            log.warning("capacity sample without usable inputs", node=self.node, id=event.id, error=str(err))
            return
        self.last_usage = usage
        self.samples += 1
        if not usage.over(self.policy):
            return
        candidates = await self._candidates()
        victims = choose_victims(usage, candidates, self.policy, self.units, self.last_eviction, self.clock())
        uids = {c.key: c.uid for c in candidates}
        if victims:
            self.last_eviction = self.clock()
            self.evicted = (self.evicted + victims)[-50:]
            over = tuple(sorted(usage.over(self.policy)))
            log.info("node under pressure; evicting oversold pods", node=self.node,
                     pods=",".join(victims), over=",".join(over))
            await self.evict(f"pressure-{event.id}", {v: uids.get(v, "") for v in victims}, over)

    def status(self) -> dict[str, Any]:
        """The last sample as the watch judged it (for /status): use, what is over, the cooldown."""
        usage, policy = self.last_usage, self.policy
        since = None if self.last_eviction is None else round(self.clock() - self.last_eviction, 3)
        return {
            "samples": self.samples,
            "memory_threshold": policy.memory_threshold, "cpu_threshold": policy.cpu_threshold,
            "memory_used_ratio": _ratio(usage.memory_used, usage.memory_total) if usage else None,
            "cpu_used_ratio": _ratio(usage.cpu_used_m, usage.cpu_total_m) if usage else None,
            "over": sorted(usage.over(policy)) if usage else [],
            "since_last_eviction_s": since, "cooldown_s": policy.cooldown_s,
            "evicted": list(self.evicted),
        }  # fmt: skip

    async def _candidates(self) -> list[OversoldPod]:
        try:
            pods, _ = await self.pods.list_pods(field_selector=f"spec.nodeName={self.node}")
        except KubeError as err:
            log.warning("cannot list pods under pressure", node=self.node, error=str(err))
            return []
        found = (oversold_pod(p) for p in read_pods(pods, self.rules, self.node).pods
                 if not p.terminating and not p.finished)
        return [p for p in found if p is not None]


def _ratio(used: float, total: float) -> float | None:
    return round(used / total, 4) if total > 0 else None
