"""Pressure eviction wired to the detector's SpareCapacity events (see :mod:`.pressure`)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from gpushare_common.adapters.kube import KubeError
from gpushare_common.events import AnyEvent, SpareCapacity
from gpushare_common.logging import get_logger

from .ports import Obj, PodApi
from .pressure import (
    NodeUsage,
    OversoldPod,
    PressureInputError,
    PressurePolicy,
    choose_victims,
    oversold_pod,
)

log = get_logger("solver.pressure")
Evict = Callable[[str, list[str]], Awaitable[None]]


class PressureWatch:
    """On each capacity sample: if the node is under pressure, evict oversold pods."""

    def __init__(self, node: str, policy: PressurePolicy, pods: PodApi, evict: Evict,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node, self.policy, self.pods, self.evict, self.clock = node, policy, pods, evict, clock
        self.units: dict[str, float] = {}
        self.last_eviction: float | None = None
        self.last_usage: NodeUsage | None = None

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
        if not usage.over(self.policy):
            return
        victims = choose_victims(usage, await self._candidates(), self.policy, self.units,
                                 self.last_eviction, self.clock())
        if victims:
            self.last_eviction = self.clock()
            log.info("node under pressure; evicting oversold pods", node=self.node,
                     pods=",".join(victims), over=",".join(sorted(usage.over(self.policy))))
            await self.evict(f"pressure-{event.id}", victims)

    async def _candidates(self) -> list[OversoldPod]:
        try:
            pods, _ = await self.pods.list_pods(field_selector=f"spec.nodeName={self.node}")
        except KubeError as err:
            log.warning("cannot list pods under pressure", node=self.node, error=str(err))
            return []
        return [p for p in (self._oversold(obj) for obj in pods if _alive(obj)) if p is not None]

    def _oversold(self, obj: Obj) -> OversoldPod | None:
        try:
            return oversold_pod(obj)
        except PressureInputError as err:
            log.warning("pod with unreadable oversold requests skipped", node=self.node, error=str(err))
            return None


def _alive(pod: Obj) -> bool:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return not meta.get("deletionTimestamp") and status.get("phase") not in ("Succeeded", "Failed")
