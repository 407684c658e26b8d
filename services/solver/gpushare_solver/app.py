"""Lifecycle of the solver: connect, load and recover state, consume events, serve HTTP, drain.

On a stop (signal) or a crashed critical task the skeleton unwinds it in
reverse: tasks cancelled, HTTP stopped, the containerd channel closed, NATS
drained.

- Consumes: the node's events (stream, durable, one at a time), its spare
  capacity (core subject, for memory/CPU pressure).
- Publishes: device health, eviction records; kmod-bridge requests; its state
  (buckets); pod deletions and conditions (API server), task kills (containerd).
- Reads: the kubelet's pod-resources at an owner-back (borrowers not reported yet).
- Runs: events; HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from gpushare_common.adapters.kube import Kube
from gpushare_common.adapters.podresources import PodResources
from gpushare_common.bus import AckPolicy
from gpushare_common.logging import get_logger
from gpushare_common.pods import PodRules
from gpushare_common.retry import Backoff
from gpushare_common.service import Skeleton
from gpushare_common.settings import CommonSettings
from prometheus_client import CollectorRegistry

from .adapters.containerd import Tasks as ContainerdTasks
from .oversell import PressureWatch
from .ports import PodApi, TaskApi
from .pressure import PRESSURE, PressurePolicy
from .service import Solver
from .settings import SolverSettings
from .state import HandlerError

SERVICE = "solver"
log = get_logger(SERVICE)


@dataclass
class Running:
    """A started solver (for tests and the runner): the service object and its skeleton."""

    solver: Solver
    skeleton: Skeleton

    @property
    def port(self) -> int:
        return self.skeleton.port


def ack_policy(settings: SolverSettings) -> AckPolicy:
    """Only an event that contradicts the state (:class:`HandlerError`) is terminated and counted;
    any failure around it (NATS, Kubernetes, containerd, the kmod-bridge) is retried, with a
    growing delay, until it passes: an owner-back is never dropped."""
    return AckPolicy(invalid=(HandlerError,), backoff=Backoff(settings.retry_first_s, settings.retry_max_s),
                     ack_wait_s=settings.ack_wait_s)


@contextlib.asynccontextmanager
async def started(common: CommonSettings, settings: SolverSettings, stop: asyncio.Event,
                  pods: PodApi | None = None, tasks_api: TaskApi | None = None,
                  registry: CollectorRegistry | None = None) -> AsyncIterator[Running]:
    node = common.node.require()
    async with Skeleton(SERVICE, common.http, "nats", "state", stop=stop, registry=registry) as svc:
        bus = await svc.connect(common.nats, node)
        if tasks_api is None:
            client = ContainerdTasks(settings.containerd_address, settings.containerd_namespace,
                                     direct=settings.direct_kill)
            tasks_api = await svc.enter(client)
        allocations = None
        if settings.pod_resources_socket:
            allocations = PodResources(settings.pod_resources_socket, settings.pod_resources_timeout_s)
            svc.on_exit(allocations.close)
        if pods is None:
            kube = Kube(common.kube)
            svc.on_exit(kube.close)
            pods = kube
        solver = Solver(node, settings, bus, pods, tasks_api, svc.registry,
                        PodRules(system_namespace=common.kube.system_namespace), allocations)
        policy = PressurePolicy(settings.memory_threshold, settings.cpu_threshold,
                                settings.pressure_cooldown_s)
        watch = PressureWatch(node, policy, solver.pods,
                              lambda trigger, pods: solver.evict(trigger, PRESSURE, pods), rules=solver.rules)
        await svc.serve(lambda: {**solver.status(), "pressure": watch.status()})
        await solver.open()
        await solver.recover()
        svc.health.set("state", True, "loaded and reconciled")
        await bus.subscribe(bus.subjects.node_capacity(node), watch.on_event)
        svc.spawn("pending", solver.resume_pending(stop))
        svc.spawn("events", bus.consume(bus.subjects.node_events(node), bus.layout.durable(node),
                                        solver.on_event, ack_policy(settings), stop, batch=1))
        yield Running(solver, svc)


async def run(common: CommonSettings, settings: SolverSettings, stop: asyncio.Event) -> int:
    async with started(common, settings, stop) as running:
        await running.skeleton.run_until_stopped()
    return running.skeleton.exit_code
