"""One simple scheduler for every simulated node.

Binds each Pending pod without ``spec.nodeName`` (and with the default
scheduler name) to a Ready, schedulable node whose labels match the pod's
``nodeSelector`` and whose allocatable still fits the pod's requests:
extended resources (``nvidia.com/gpu``, ``gpushare/...``) always, ``cpu`` and
``memory`` when the node reports them.  Among the nodes that fit it picks the
one with the most of the pod's extended resources left (spreading), then the
name.  Pods that fit nowhere stay Pending and are tried again.

Pods with resource claims (Dynamic Resource Allocation) also need a node where every claim
is allocated or can be allocated from that node's ResourceSlices; the claims are allocated
and reserved for the pod before it is bound, and released when it is gone
(:mod:`gpushare_sim.dra.scheduling`). An extended resource a DeviceClass serves
(``extendedResourceName``) is taken from the device plugin on a node that has it in its
allocatable, else through a special claim allocated there (:mod:`gpushare_sim.dra.extended`).

Run: ``python -m gpushare_sim.scheduler --api KUBECONFIG``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import replace
from decimal import Decimal
from typing import Any

from gpushare_common.tasks import run_service

from gpushare_sim.dra.allocator import AllocationError
from gpushare_sim.dra.scheduling import DraScheduling, NotReady, pod_claims
from gpushare_sim.node.adapters.kube import Conflict, KubeError, NotFound, SimKube
from gpushare_sim.node.events import NORMAL, WARNING, EventRecorder, Involved
from gpushare_sim.node.model import PodDef, PodError, parse_pod, parse_quantity

log = logging.getLogger("gpushare_sim.scheduler")

DEFAULT_SCHEDULER = "default-scheduler"
TERMINAL_PHASES = ("Succeeded", "Failed")


def node_allocatable(node: dict[str, Any]) -> dict[str, Decimal]:
    status = node.get("status") or {}
    raw = status.get("allocatable") or status.get("capacity") or {}
    out: dict[str, Decimal] = {}
    for resource, quantity in raw.items():
        try:
            out[resource] = parse_quantity(quantity, f"node allocatable {resource}")
        except PodError:
            continue
    return out


def node_ready(node: dict[str, Any]) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def free_resources(node: dict[str, Any], pods: list[PodDef]) -> dict[str, Decimal]:
    name = (node.get("metadata") or {}).get("name")
    free = node_allocatable(node)
    for pod in pods:
        if pod.node_name != name or pod.phase in TERMINAL_PHASES:
            continue
        for resource, amount in pod.requests().items():
            if resource in free:
                free[resource] -= amount
    return free


def fits(requests: dict[str, Decimal], free: dict[str, Decimal]) -> bool:
    for resource, amount in requests.items():
        if amount <= 0:
            continue
        extended = "/" in resource
        if (extended or resource in free) and free.get(resource, Decimal(0)) < amount:
            return False
    return True


def _matches(pod: PodDef, node: dict[str, Any]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in pod.node_selector.items())


def served_by_dra(node: dict[str, Any], mapped: Iterable[str]) -> set[str]:
    """Of the extended resources a DeviceClass serves, those this node's allocatable lacks: DRA
    serves them here (the device plugin where the node has them)."""
    allocatable = node_allocatable(node)
    return {r for r in mapped if allocatable.get(r, Decimal(0)) == 0}


def choose_node(pod: PodDef, nodes: list[dict[str, Any]], pods: list[PodDef],
                fits_claims: Callable[[dict[str, Any]], bool] | None = None,
                mapped: Iterable[str] = ()) -> str | None:
    requests = pod.requests()
    extended = [r for r in requests if "/" in r]
    candidates: list[tuple[Decimal, str]] = []
    for node in nodes:
        if not node_ready(node) or not _matches(pod, node):
            continue
        free = free_resources(node, pods)
        by_dra = served_by_dra(node, mapped)
        here = {r: q for r, q in requests.items() if r not in by_dra}
        if fits(here, free) and (fits_claims is None or fits_claims(node)):
            spare = sum((free.get(r, Decimal(0)) - requests[r] for r in extended), Decimal(0))
            candidates.append((-spare, str(node["metadata"]["name"])))
    return min(candidates)[1] if candidates else None


def pending_unbound(obj: dict[str, Any]) -> bool:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    meta = obj.get("metadata") or {}
    return (
        not spec.get("nodeName")
        and spec.get("schedulerName", DEFAULT_SCHEDULER) == DEFAULT_SCHEDULER
        and status.get("phase", "Pending") == "Pending"
        and not meta.get("deletionTimestamp")
    )


class Scheduler:
    def __init__(self, api: SimKube, interval_s: float = 0.2, events: EventRecorder | None = None) -> None:
        self.api = api
        self.events = events or EventRecorder(None, "default-scheduler")
        self.interval_s = interval_s
        self.bound = 0
        self.dra = DraScheduling(api)
        self._waiting: dict[str, str] = {}  # pod key -> why it is not scheduled (one event each)

    async def schedule_once(self) -> int:
        """One pass; returns how many pods were bound."""
        objs, _ = await self.api.list_pods()
        nodes, _ = await self.api.list_nodes()
        pods = [p for p in map(_parse, objs) if p is not None]
        if any(pod_claims(o) or _asks_extended(o) for o in objs) or self.dra.objects.claims:
            await self.dra.refresh()
            if await self.dra.release(objs):
                await self.dra.refresh()
        bound = 0
        for obj in objs:
            pod = _parse(obj) if pending_unbound(obj) else None
            target = await self._place(obj, pod, nodes, pods) if pod is not None else None
            if pod is None or target is None:
                continue
            try:
                await self.api.bind_pod(pod.namespace, pod.name, target)
            except (Conflict, NotFound) as err:
                log.info("bind skipped pod=%s: %s", pod.key, err)
                continue
            log.info("pod bound pod=%s node=%s", pod.key, target)
            self.events.record(Involved.pod(pod), NORMAL, "Scheduled", f"Successfully assigned {pod.key} to {target}")
            pods = [p for p in pods if p.key != pod.key]
            pods.append(_with_node(pod, target))
            bound += 1
        self.bound += bound
        return bound

    async def _place(self, obj: dict[str, Any], pod: PodDef, nodes: list[dict[str, Any]],
                     pods: list[PodDef]) -> str | None:
        """The node for ``pod``; a pod with claims, or with extended resources DRA serves on the
        node, gets them allocated and reserved there first."""
        mapped = self.dra.extended_resources(obj)
        if not pod_claims(obj) and not mapped:
            return choose_node(pod, nodes, pods)
        try:
            claims = await self.dra.ensure_claims(obj)
        except (NotReady, KubeError) as why:
            self._waiting_for(pod, str(why))
            return None
        plans: dict[str, tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]] = {}
        reasons: list[str] = []

        def fits_claims(node: dict[str, Any]) -> bool:
            name = str(node["metadata"]["name"])
            try:
                special = self.dra.extended_claim(obj, served_by_dra(node, mapped))
                wanted = [*claims, *([special] if special is not None else [])]
                plans[name] = (wanted, self.dra.plan(wanted, name))
            except AllocationError as err:
                reasons.append(f"{name}: {err}")
                return False
            return True

        target = choose_node(pod, nodes, pods, fits_claims, mapped)
        if target is None:
            self._waiting_for(pod, "; ".join(reasons) or "no node fits the pod's requests")
            return None
        wanted, plan = plans[target]
        wanted, plan = await self.dra.create_extended(obj, wanted, plan)
        await self.dra.reserve(obj, wanted, plan, target)
        self._waiting.pop(pod.key, None)
        return target

    def _waiting_for(self, pod: PodDef, why: str) -> None:
        if self._waiting.get(pod.key) != why:
            self._waiting[pod.key] = why
            log.info("pod not schedulable pod=%s: %s", pod.key, why)
            self.events.record(Involved.pod(pod), WARNING, "FailedScheduling", why[:1000])

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.schedule_once()
            except KubeError as err:
                log.warning("scheduling pass failed: %s", err)
            try:
                await asyncio.wait_for(stop.wait(), self.interval_s)
            except TimeoutError:
                pass


def _asks_extended(obj: dict[str, Any]) -> bool:
    """A pending pod asking for an extended resource (a DeviceClass may serve it)."""
    return pending_unbound(obj) and any(
        "/" in r for c in (obj.get("spec") or {}).get("containers") or [] if isinstance(c, dict)
        for part in ("requests", "limits") for r in ((c.get("resources") or {}).get(part) or {}))


def _parse(obj: dict[str, Any]) -> PodDef | None:
    try:
        return parse_pod(obj)
    except PodError:
        return None


def _with_node(pod: PodDef, node: str) -> PodDef:
    return replace(pod, node_name=node)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpushare_sim.scheduler")
    parser.add_argument("--api", required=True, help="kubeconfig of the API server")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between passes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    async def serve(stop: asyncio.Event) -> int:
        api = SimKube.from_kubeconfig(args.api)
        try:
            await Scheduler(api, args.interval).run(stop)
        finally:
            await api.close()
        return 0

    return run_service("sim-scheduler", serve)


if __name__ == "__main__":
    sys.exit(main())
