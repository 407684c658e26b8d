"""Never lose an owner-back: each transient failure on the owner-back path, injected once, and the
borrower is still killed, deleted and recorded exactly once, and the owner released.

Real servers throughout (a nats-server of the test's own that a fault may restart, containerd
with runc containers, the API emulator); the faults are injected at the solver's own ports
(pods, tasks, its buckets and publisher) or by restarting the nats-server mid-handler.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from gpushare_common.adapters.kube import Kube
from gpushare_common.adapters.kube import Retryable as KubeRetryable
from gpushare_common.bus import Transient
from gpushare_common.events import EvictionRecord, LowPowerEvent, OwnerBackEvent, ReservedEvent, SpotEvent
from gpushare_common.settings import NatsSettings
from gpushare_sim.containerd import Containerd
from gpushare_solver import app
from gpushare_solver.ports import ContainerdUnavailable

from tests.solver.conftest import NODE, FakeBridge, wait_for
from tests.solver.world import World, client_bus, common_settings, solver_settings
from tests.support.kubeapi import KubeApi
from tests.support.kubelet import Kubelet
from tests.support.nats import NatsServer

pytestmark = pytest.mark.containerd
OWNER, BORROWER = "dev/alice", "spot/b1"


class Once:
    """A fault that fires the first time its point is reached after it is armed."""

    def __init__(self, point: str) -> None:
        self.point = point
        self.armed = False
        self.fired = 0

    async def maybe(self, point: str, fault: Callable[[], Awaitable[None]]) -> None:
        if self.armed and point == self.point and not self.fired:
            self.fired += 1
            await fault()


class FaultyPods:
    """The solver's PodApi (the Kubernetes adapter) with one injected API failure."""

    def __init__(self, kube: Kube, fault: Once, on_delete: Callable[[], Awaitable[None]]) -> None:
        self.kube, self.fault, self.on_delete = kube, fault, on_delete

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kube, name)

    async def _api_failure(self) -> None:
        raise KubeRetryable("DELETE pod: 503 Service Unavailable (injected)")

    async def get_pod(self, namespace: str, name: str) -> Any:
        await self.fault.maybe("api-get", self._api_timeout)
        return await self.kube.get_pod(namespace, name)

    async def _api_timeout(self) -> None:
        raise KubeRetryable("GET pod: read timed out (injected)")

    async def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None,
                         uid: str = "") -> Any:  # fmt: skip
        await self.fault.maybe("api-delete", self._api_failure)
        await self.fault.maybe("connection-lost", self.on_delete)
        return await self.kube.delete_pod(namespace, name, grace_seconds=grace_seconds, uid=uid)


class FaultyTasks:
    def __init__(self, tasks: Any, fault: Once) -> None:
        self.tasks, self.fault = tasks, fault

    async def _unavailable(self) -> None:
        raise ContainerdUnavailable("containerd: connection refused (injected)")

    async def kill_all(self, container_ids: list[str], timeout_s: float,
                       pids: dict[str, int] | None = None) -> Any:  # fmt: skip
        await self.fault.maybe("containerd", self._unavailable)
        return await self.tasks.kill_all(container_ids, timeout_s, pids)

    async def pids(self, container_ids: list[str]) -> dict[str, int]:
        return await self.tasks.pids(container_ids)


def fail_once_in(target: Any, method: str, fault: Once, point: str) -> None:
    """Make ``target.method`` raise a bus Transient once (the store's or publisher's own error)."""
    original = getattr(target, method)

    async def transient() -> None:
        raise Transient(f"{method} (injected)", "nats: timeout")

    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        await fault.maybe(point, transient)
        return await original(*args, **kwargs)

    setattr(target, method, wrapped)


@contextlib.asynccontextmanager
async def node(server: NatsServer, prefix: str, kube_api: KubeApi, kube: Kube, containerd: Containerd,
               fault: Once, kubelet: Kubelet) -> AsyncIterator[tuple[app.Service, NatsSettings]]:  # fmt: skip
    nats = NatsSettings(url=server.url, prefix=f"{prefix}.v1", stream=prefix.upper(), kv_prefix=prefix,
                        reconnect_wait_s=0.05, connect_timeout_s=0.5, ensure_layout=True)

    async def lose_the_connection() -> None:
        await asyncio.to_thread(server.restart)

    from gpushare_solver.adapters.containerd import Tasks

    stop = asyncio.Event()
    settings = solver_settings(containerd, kubelet, release_retry_s=10.0, kmod_timeout_s=0.5)
    async with Tasks(settings.containerd_address, settings.containerd_namespace) as tasks, \
            app.Service(common_settings(nats, kube_api.kubeconfig, NODE), settings, stop,
                        pods=FaultyPods(kube, fault, lose_the_connection),
                        tasks_api=FaultyTasks(tasks, fault)).started() as running:  # fmt: skip
        solver = running.solver
        fail_once_in(solver._stores["plan"], "put", fault, "kv-put")
        fail_once_in(solver.reclaimer.outbox, "publish_once", fault, "publish")
        yield running, nats
        stop.set()


FAULTS = ["kv-put", "publish", "connection-lost", "containerd", "api-delete", "api-get", "kmod-timeout"]


@pytest.mark.parametrize("point", FAULTS)
async def test_owner_back_survives_one_transient_failure(
    point: str, subject_prefix: str, kube_api: KubeApi, kube: Kube, containerd: Containerd, rootfs: Path,
    kubelet: Kubelet,
) -> None:
    fault = Once(point)
    server = NatsServer().start()
    try:
        async with node(server, subject_prefix, kube_api, kube, containerd, fault, kubelet) as (running, nats), \
                client_bus(nats) as bus:  # fmt: skip
            bridge = FakeBridge()
            if point == "kmod-timeout":
                bridge.silent_first = "release"  # the first release gets no answer in time
            await bus.serve(bus.subjects.node_kmod(NODE), bridge.answer)
            world = World(containerd, rootfs, kube, bus, NODE, kubelet)
            await lend_one_card(world)
            await wait_for(lambda: running.solver.state.borrowers() == {"spot-GPU-0": BORROWER},
                           what="the borrower")  # fmt: skip
            # its containers read ahead (a get_pod of its own): the fault lands on the owner-back's path
            await wait_for(lambda: BORROWER in running.solver.reclaimer.known, what="the borrower's containers")
            fault.armed = True
            start = await bus.last_seq()
            back = OwnerBackEvent(node=NODE, pidns=4026532001, pid=7, kernel_ts_ns=1, pod=OWNER, resolved=True)
            await world.publish("ownerback", back)
            def injected() -> bool:
                return bool(fault.fired) or (point == "kmod-timeout" and len(bridge.ops("release")) > 1)

            await wait_for(lambda: not running.solver.plans and injected(), timeout=30,
                           what=f"the owner-back handled through the {point} fault")  # fmt: skip
            await wait_for(lambda: released(bridge), timeout=15, what="the owner released")
            recorded: list[tuple[str, str, str]] = []

            async def eviction_recorded() -> bool:  # the fault may fire before the owner-back is taken
                records = [m.event() for m in await bus.read_after(bus.subjects.eviction(NODE), start)]
                recorded[:] = [(r.pod, r.reason, r.outcome) for r in records if isinstance(r, EvictionRecord)]
                return bool(recorded) and not running.solver.plans

            await wait_for(eviction_recorded, timeout=15, what="the eviction recorded")
            assert recorded == [(BORROWER, "owner-back", "evicted")]
            assert world.task_status("b1-main") == "STOPPED" and not await world.pod_exists(BORROWER)
            assert running.solver.metrics.events.labels("ownerback", "rejected")._value.get() == 0
            assert bus.metrics.terminated.labels("HandlerError")._value.get() == 0
    finally:
        server.cleanup()


def released(bridge: FakeBridge) -> bool:
    return any(c.pods == (OWNER,) for c in bridge.answered("release"))


async def lend_one_card(world: World) -> None:
    await world.kube.create_pod("dev", {"metadata": {"name": "alice"}, "spec": {
        "nodeName": NODE, "containers": [{"name": "main", "image": "busybox"}]}})
    await world.add_pod(BORROWER, ["b1-main"], devices={"gpushare/spot-gpu": ["spot-GPU-0"]})
    for kind, event in (
        ("generic", ReservedEvent(node=NODE, pod=OWNER, container="main", lendable=True,
                                 vendor_resource="nvidia.com/gpu", state="using", devices=("GPU-0",))),
        ("lowpower", LowPowerEvent(node=NODE, owner=OWNER, using=False, devices=("GPU-0",))),
        ("spot", SpotEvent(node=NODE, pod=BORROWER, container="c0", state="using", devices=("spot-GPU-0",))),
    ):
        await world.publish(kind, event)
