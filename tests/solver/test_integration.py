"""The solver against real servers: nats-server (JetStream), containerd running runc containers,
the Kubernetes API emulator, and a stand-in kmod-bridge on the kmod subject."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from gpushare_common.adapters.kube import Kube
from gpushare_common.events import (
    AnyEvent,
    DeviceHealth,
    EvictionRecord,
    GenericEvent,
    LowPowerEvent,
    OwnerBackEvent,
    SpotEvent,
)
from gpushare_common.settings import KubeSettings, NatsSettings
from gpushare_sim.containerd import Containerd
from gpushare_solver import app
from gpushare_solver.settings import SolverSettings

from tests.solver.conftest import NODE, FakeBridge, wait_for
from tests.solver.world import World, client_bus, common_settings, solver_settings
from tests.support.kubeapi import KubeApi

pytestmark = pytest.mark.containerd
OWNER = "dev/alice"
BORROWERS = {"spot/b1": ["b1-main", "b1-side"], "spot/b2": ["b2-main"]}


@pytest.fixture
def kube(kube_api: KubeApi) -> Iterator[Kube]:
    client = Kube(KubeSettings(kubeconfig=str(kube_api.kubeconfig)))
    yield client
    client.api.close()


@contextlib.asynccontextmanager
async def solver(nats: NatsSettings, kubeconfig: Path, settings: SolverSettings,
                 kube: Kube) -> AsyncIterator[app.Running]:
    stop = asyncio.Event()
    async with app.started(common_settings(nats, kubeconfig, NODE), settings, stop, pods=kube) as running:
        yield running
        stop.set()


async def lend_two_cards(world: World) -> None:
    """alice holds GPU-0 and GPU-1 and goes away; b1 borrows spot-GPU-0, b2 spot-GPU-1."""
    await world.kube.create_pod("dev", {"metadata": {"name": "alice"}, "spec": {
        "nodeName": NODE, "containers": [{"name": "main", "image": "busybox"}]}})
    for pod, containers in BORROWERS.items():
        await world.add_pod(pod, containers)
    await world.publish("generic", GenericEvent(node=NODE, pod=OWNER, container="main", lendable=True,
                                                vendor_resource="nvidia.com/gpu", state="using",
                                                devices=("GPU-0", "GPU-1")))
    await world.publish("lowpower", LowPowerEvent(node=NODE, owner=OWNER, using=False,
                                                  devices=("GPU-0", "GPU-1")))
    await world.publish("spot", SpotEvent(node=NODE, pod="spot/b1", container="c0", state="using",
                                          devices=("spot-GPU-0",)))
    await world.publish("spot", SpotEvent(node=NODE, pod="spot/b2", container="c0", state="using",
                                          devices=("spot-GPU-1",)))


class Recorder:
    def __init__(self) -> None:
        self.events: list[AnyEvent] = []

    async def __call__(self, event: AnyEvent) -> None:
        self.events.append(event)

    def of(self, kind: type[AnyEvent]) -> list[AnyEvent]:
        return [e for e in self.events if isinstance(e, kind)]


async def stored_count(world: World, subject: str) -> int:
    info = await world.bus.js.stream_info(world.bus.settings.stream, subjects_filter=subject)
    return int((info.state.subjects or {}).get(subject, 0))


def http_json(port: int, path: str) -> object:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        body = response.read()
    return json.loads(body) if path != "/metrics" else body.decode()


async def test_owner_back_kills_evicts_releases(
    nats_settings: NatsSettings, kube_api: KubeApi, kube: Kube, containerd: Containerd, rootfs: Path,
    bridge: FakeBridge,
) -> None:
    async with client_bus(nats_settings) as bus, \
            solver(nats_settings, kube_api.kubeconfig, solver_settings(containerd), kube) as running:
        world = World(containerd, rootfs, kube, bus, NODE)
        seen = Recorder()
        await bus.subscribe(bus.subjects.eviction(NODE), seen)
        await bus.subscribe(bus.subjects.node_health(NODE), seen)
        await lend_two_cards(world)
        await wait_for(lambda: len(running.solver.state.borrowers()) == 2, what="two borrowers")
        assert [c.pods for c in bridge.ops("detect")] == [(OWNER,)]
        status = await asyncio.to_thread(http_json, running.port, "/status")
        assert status["borrowers"] == {"spot-GPU-0": "spot/b1", "spot-GPU-1": "spot/b2"}  # type: ignore[index]

        back = OwnerBackEvent(node=NODE, pidns=4026532001, pid=77, kernel_ts_ns=1, pod=OWNER, resolved=True)
        await world.publish("ownerback", back)
        await wait_for(lambda: len(seen.of(EvictionRecord)) == 2, what="two eviction records")

        for containers in BORROWERS.values():
            for container_id in containers:
                assert world.task_status(container_id) == "STOPPED"
        for pod in BORROWERS:
            assert not await world.pod_exists(pod)
        assert await world.pod_exists(OWNER)
        release = bridge.ops("release")
        assert [(c.pods, c.pidns) for c in release] == [((OWNER,), (4026532001,))]
        records = {r.pod: r for r in seen.of(EvictionRecord)}  # type: ignore[attr-defined]
        assert set(records) == set(BORROWERS)
        assert all(r.reason == "owner-back" and r.outcome == "evicted" and r.trigger_id == back.id
                   for r in records.values())
        assert sorted(records["spot/b1"].containers) == sorted(BORROWERS["spot/b1"])
        health = [h for h in seen.of(DeviceHealth) if h.reason == f"owner {OWNER} back"]  # type: ignore[attr-defined]
        assert health and health[-1].devices == {"spot-GPU-0": "Unhealthy", "spot-GPU-1": "Unhealthy"}  # type: ignore[attr-defined]
        await wait_for(lambda: not running.solver.plans, what="no plan in flight")
        metrics = await asyncio.to_thread(http_json, running.port, "/metrics")
        assert 'gpushare_solver_evictions_total{outcome="evicted",reason="owner-back"} 2.0' in str(metrics)
