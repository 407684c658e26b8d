"""Lifecycle of the solver: connect, load and recover state, consume events, serve HTTP, drain.

On a stop (signal) or a crashed critical task the skeleton unwinds it in
reverse: tasks cancelled, HTTP stopped, the containerd channel closed, NATS
drained.

- Consumes: the node's events (stream, durable, one at a time), its spare
  capacity (core subject, for memory/CPU pressure).
- Publishes: device health, eviction records; kmod-bridge requests; its state
  (buckets); pod deletions and conditions (API server), task kills (containerd).
- Reads: the kubelet's pod-resources at every reclaim (it confirms each pod to be killed holds a
  device of the card taken back; and names borrowers not reported yet).
- Runs: events; HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from gpushare_common.adapters.kube import Kube
from gpushare_common.adapters.podresources import PodResources
from gpushare_common.bus import AckPolicy
from gpushare_common.logging import get_logger
from gpushare_common.pods import PodRules
from gpushare_common.retry import Backoff
from gpushare_common.service import ServiceBase
from gpushare_common.settings import CommonSettings
from prometheus_client import CollectorRegistry

from .adapters.containerd import Tasks as ContainerdTasks
from .oversell import PressureWatch
from .ports import Allocations, PodApi, TaskApi
from .pressure import PRESSURE, PressurePolicy
from .service import Solver
from .settings import SolverSettings
from .state import HandlerError
from .status import SolverStatus

SERVICE = "solver"
log = get_logger(SERVICE)


def ack_policy(settings: SolverSettings) -> AckPolicy:
    """Only an event that contradicts the state (:class:`HandlerError`) is terminated and counted;
    any failure around it (NATS, Kubernetes, containerd, the kmod-bridge) is retried, with a
    growing delay, until it passes: an owner-back is never dropped."""
    return AckPolicy(invalid=(HandlerError,), backoff=Backoff(settings.retry_first_s, settings.retry_max_s),
                     ack_wait_s=settings.ack_wait_s, check_s=settings.consumer_check_s)


class Service(ServiceBase):
    """One node's solver; ``pods``, ``tasks_api``: the Kubernetes and containerd ports (tests
    pass their own)."""

    status_model = SolverStatus

    def __init__(self, common: CommonSettings, settings: SolverSettings, stop: asyncio.Event | None = None,
                 pods: PodApi | None = None, tasks_api: TaskApi | None = None,
                 registry: CollectorRegistry | None = None,
                 allocations: Allocations | None = None) -> None:  # fmt: skip
        super().__init__(SERVICE, common.http, "nats", "state", stop=stop, registry=registry)
        self.node = node = common.node.require()
        self.settings = settings
        self.bus = self.skeleton.bus(common.nats, node)
        self.containerd: ContainerdTasks | None = None
        if tasks_api is None:
            tasks_api = self.containerd = ContainerdTasks(settings.containerd_address, settings.containerd_namespace,
                                                          direct=settings.direct_kill)  # fmt: skip
        if allocations is None and settings.pod_resources_socket:
            kubelet = PodResources(settings.pod_resources_socket, settings.pod_resources_timeout_s)
            self.skeleton.on_exit(kubelet.close)
            allocations = kubelet
        elif allocations is None:
            log.error("no pod-resources socket: the kubelet confirms no eviction, so none happens",
                      node=node, setting="GPUSHARE_SOLVER_POD_RESOURCES_SOCKET")
        if pods is None:
            kube = Kube(common.kube)
            self.skeleton.on_exit(kube.close)
            pods = kube
        self.solver = Solver(node, settings, self.bus, pods, tasks_api, self.registry,
                             PodRules(system_namespace=common.kube.system_namespace), allocations)
        policy = PressurePolicy(settings.memory_threshold, settings.cpu_threshold, settings.pressure_cooldown_s)
        self.pressure = PressureWatch(node, policy, self.solver.pods,
                                      lambda trigger, pods, over: self.solver.evict(trigger, PRESSURE, pods, over),
                                      rules=self.solver.rules)  # fmt: skip

    async def start(self) -> None:
        svc, bus, solver, stop = self.skeleton, self.bus, self.solver, self.skeleton.stop
        if self.containerd is not None:
            await svc.enter(self.containerd)
        await bus.connect(stop)
        await bus.wait_for_stream(stop)
        await solver.open()
        svc.spawn("kernel hold parameters", solver.reclaimer.read_timing(stop), critical=False)
        await solver.recover()
        self.health.set("state", True, "loaded and reconciled")
        await bus.subscribe(bus.subjects.node_capacity(self.node), self.pressure.on_event)
        svc.spawn("pending", solver.resume_pending(stop))
        svc.spawn("events", bus.consume(bus.subjects.node_events(self.node), bus.layout.durable(self.node),
                                        solver.on_event, ack_policy(self.settings), stop, batch=1))

    def status(self) -> Mapping[str, Any]:
        return {**self.solver.status(), "pressure": self.pressure.status()}
