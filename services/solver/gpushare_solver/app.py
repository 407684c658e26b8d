"""Lifecycle of the solver: connect, load and recover state, consume events, serve HTTP, drain.

Everything runs inside one AsyncExitStack so a stop (signal) or a crashed
critical task unwinds it in reverse: tasks cancelled, HTTP stopped, the
containerd channel closed, NATS drained.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from gpushare_common.adapters.kube import Kube
from gpushare_common.bus import AckPolicy, Bus
from gpushare_common.http import Health, bound_port, build_app, serve
from gpushare_common.logging import get_logger
from gpushare_common.pods import PodRules
from gpushare_common.retry import Backoff
from gpushare_common.settings import CommonSettings
from gpushare_common.tasks import Tasks, wait_first
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
    """A started solver (for tests and the runner): the service object and its HTTP port."""

    solver: Solver
    health: Health
    tasks: Tasks
    port: int


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
    registry = registry or CollectorRegistry()
    health = Health("nats", "state")
    tasks = Tasks(SERVICE)
    async with contextlib.AsyncExitStack() as stack:
        bus = Bus(common.nats, SERVICE, registry, node)
        bus.on_state.append(lambda up: health.set("nats", up, "" if up else "disconnected"))
        await bus.connect(stop)
        stack.push_async_callback(bus.drain)
        await bus.wait_for_stream(stop)
        if tasks_api is None:
            client = ContainerdTasks(settings.containerd_address, settings.containerd_namespace,
                                     direct=settings.direct_kill)
            tasks_api = await stack.enter_async_context(client)
        solver = Solver(node, settings, bus, pods or Kube(common.kube), tasks_api, registry,
                        PodRules(system_namespace=common.kube.system_namespace))
        policy = PressurePolicy(settings.memory_threshold, settings.cpu_threshold,
                                settings.pressure_cooldown_s)
        watch = PressureWatch(node, policy, solver.pods,
                              lambda trigger, pods: solver.evict(trigger, PRESSURE, pods))
        app = build_app(SERVICE, health, registry, lambda: {**solver.status(), "pressure": watch.status()})
        server = await stack.enter_async_context(serve(app, common.http))
        stack.push_async_callback(tasks.cancel_all)
        await solver.open()
        await solver.recover()
        health.set("state", True, "loaded and reconciled")
        await bus.subscribe(bus.subjects.node_capacity(node), watch.on_event)
        tasks.spawn("pending", solver.resume_pending(stop))
        tasks.spawn("events", bus.consume(bus.subjects.node_events(node), bus.layout.durable(node),
                                          solver.on_event, ack_policy(settings), stop, batch=1))
        yield Running(solver, health, tasks, bound_port(server))


async def run(common: CommonSettings, settings: SolverSettings, stop: asyncio.Event) -> int:
    async with started(common, settings, stop) as running:
        await wait_first(stop, running.tasks)
        return 1 if running.tasks.failure is not None else 0
