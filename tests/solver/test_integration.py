"""The solver against real servers: nats-server (JetStream), containerd running runc containers,
the Kubernetes API emulator, and a stand-in kmod-bridge on the kmod subject."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from gpushare_common.adapters.kube import Kube, Obj
from gpushare_common.events import (
    AnyEvent,
    DeviceHealth,
    EvictionRecord,
    LowPowerEvent,
    OwnerBackEvent,
    ReservedEvent,
    SpareCapacity,
    SpotEvent,
    event_tag,
)
from gpushare_common.settings import NatsSettings
from gpushare_sim.containerd import Containerd
from gpushare_solver import app
from gpushare_solver.settings import SolverSettings

from tests.solver.conftest import NODE, FakeBridge, wait_for
from tests.solver.jobpolicy import IGNORE_DISRUPTIONS, matched_action
from tests.solver.world import World, client_bus, common_settings, solver_settings
from tests.support.kubeapi import KubeApi
from tests.support.kubelet import Kubelet

pytestmark = pytest.mark.containerd
OWNER = "dev/alice"
BORROWERS = {"spot/b1": ["b1-main", "b1-side"], "spot/b2": ["b2-main"]}
LENT = {"spot/b1": "spot-GPU-0", "spot/b2": "spot-GPU-1"}  # what the kubelet allocated each borrower


@contextlib.asynccontextmanager
async def solver(nats: NatsSettings, kubeconfig: Path, settings: SolverSettings,
                 kube: Kube) -> AsyncIterator[app.Service]:
    stop = asyncio.Event()
    async with app.Service(common_settings(nats, kubeconfig, NODE), settings, stop, pods=kube).started() as running:
        yield running
        stop.set()


async def lend_two_cards(world: World) -> list[AnyEvent]:
    """alice holds GPU-0 and GPU-1 and goes away; b1 borrows spot-GPU-0, b2 spot-GPU-1."""
    await world.kube.create_pod("dev", {"metadata": {"name": "alice"}, "spec": {
        "nodeName": NODE, "containers": [{"name": "main", "image": "busybox"}]}})
    for pod, containers in BORROWERS.items():
        await world.add_pod(pod, containers, devices={"gpushare/spot-gpu": [LENT[pod]]})
    events: list[AnyEvent] = [
        ReservedEvent(node=NODE, pod=OWNER, container="main", lendable=True,
                     vendor_resource="nvidia.com/gpu", state="using", devices=("GPU-0", "GPU-1")),
        LowPowerEvent(node=NODE, owner=OWNER, using=False, devices=("GPU-0", "GPU-1")),
        SpotEvent(node=NODE, pod="spot/b1", container="c0", state="using", devices=("spot-GPU-0",)),
        SpotEvent(node=NODE, pod="spot/b2", container="c0", state="using", devices=("spot-GPU-1",)),
    ]
    for event in events:
        await world.publish(event_tag(event), event)
    return events


class Recorder:
    def __init__(self) -> None:
        self.events: list[AnyEvent] = []

    async def __call__(self, event: AnyEvent) -> None:
        self.events.append(event)

    def of(self, kind: type[AnyEvent]) -> list[AnyEvent]:
        return [e for e in self.events if isinstance(e, kind)]


async def stored_count(world: World, subject: str) -> int:
    return len(await world.bus.read_after(subject, 0))


def http_json(port: int, path: str) -> object:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        body = response.read()
    return json.loads(body) if path != "/metrics" else body.decode()


class LastSeen:
    """The Kubernetes adapter, reading each pod from the API just before the solver deletes it."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.before_delete: dict[str, Obj] = {}

    def __getattr__(self, name: str) -> object:
        return getattr(self.kube, name)

    async def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None,
                         uid: str = "") -> Obj | None:
        self.before_delete[f"{namespace}/{name}"] = await self.kube.get_pod(namespace, name)
        return await self.kube.delete_pod(namespace, name, grace_seconds, uid)


async def solver_events(kube_api: KubeApi, namespace: str) -> list[Any]:
    core = kubernetes.client.CoreV1Api(kube_api.new_client())
    listed = await asyncio.to_thread(core.list_namespaced_event, namespace)
    return [e for e in listed.items if e.source.component == "gpushare-solver"]


async def test_owner_back_kills_evicts_releases(
    nats_settings: NatsSettings, kube_api: KubeApi, kube: Kube, containerd: Containerd, rootfs: Path,
    kubelet: Kubelet,
    bridge: FakeBridge,
) -> None:
    """... and tells each borrower why in Kubernetes' terms: its DisruptionTarget condition is
    on the pod in the API when it is deleted, so a Job's podFailurePolicy rule on it matches,
    and an Event on it names the owner, the card and the node."""
    pods = LastSeen(kube)
    async with client_bus(nats_settings) as bus, \
            solver(nats_settings, kube_api.kubeconfig, solver_settings(containerd, kubelet), pods) as running:  # type: ignore[arg-type]
        world = World(containerd, rootfs, kube, bus, NODE, kubelet)
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
        for pod in BORROWERS:
            conditions = pods.before_delete[pod]["status"]["conditions"]
            (condition,) = [c for c in conditions if c["type"] == "DisruptionTarget"]
            assert (condition["status"], condition["reason"]) == ("True", "OwnerReturned")
            assert matched_action(IGNORE_DISRUPTIONS, pods.before_delete[pod]) == "Ignore"
        events = await solver_events(kube_api, "spot")
        told = {(e.involved_object.name, e.type, e.reason, e.source.host) for e in events}
        assert told == {("b1", "Normal", "OwnerReturned", NODE), ("b2", "Normal", "OwnerReturned", NODE)}


class StuckDelete:
    """The Kubernetes adapter, except that a pod delete never returns (the solver dies there)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.reached = asyncio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self.kube, name)

    async def delete_pod(self, *args: object, **kwargs: object) -> None:
        self.reached.set()
        await asyncio.Event().wait()


def counter(running: app.Service, event: str, result: str) -> float:
    value = running.solver.metrics.events.labels(event, result)._value.get()
    return float(value)


async def test_restart_between_kill_and_delete_finishes_once_and_replays_change_nothing(
    nats_settings: NatsSettings, kube_api: KubeApi, kube: Kube, containerd: Containerd, rootfs: Path,
    kubelet: Kubelet,
    bridge: FakeBridge,
) -> None:
    settings = solver_settings(containerd, kubelet, ack_wait_s=1.0)
    stuck = StuckDelete(kube)  # the first solver "dies" in its first delete: cancelled by the stop below

    async with client_bus(nats_settings) as bus:
        world = World(containerd, rootfs, kube, bus, NODE, kubelet)
        records = Recorder()
        await bus.subscribe(bus.subjects.eviction(NODE), records)
        back = OwnerBackEvent(node=NODE, pidns=9, pid=1, kernel_ts_ns=1, pod=OWNER, resolved=True)
        async with solver(nats_settings, kube_api.kubeconfig, settings, stuck) as first:  # type: ignore[arg-type]
            lent = await lend_two_cards(world)
            await wait_for(lambda: len(first.solver.state.borrowers()) == 2, what="two borrowers")
            await world.publish("ownerback", back)
            await wait_for(stuck.reached.is_set, what="the kill step")
            assert world.task_status("b1-main") == "STOPPED"
            assert await world.pod_exists("spot/b1") and not records.events
            assert len(bridge.ops("release")) == 1  # the owner does not wait for the deletes

        async with solver(nats_settings, kube_api.kubeconfig, settings, kube) as second:
            await wait_for(lambda: len(records.events) == 2, what="the eviction finished after restart")
            assert not await world.pod_exists("spot/b1") and not await world.pod_exists("spot/b2")
            assert len(bridge.ops("release")) == 1
            assert second.solver.status()["evictions_in_flight"] == []
            await wait_for(lambda: counter(second, "ownerback", "duplicate") >= 1, timeout=15,
                           what="the unacknowledged owner-back redelivered and ignored")
            for event in (lent[1], back):  # replay: the same events published again
                await bus.publish(bus.subjects.event(NODE, event_tag(event)), event)
            await wait_for(lambda: counter(second, "lowpower", "duplicate") >= 1, what="replay seen")
            await wait_for(lambda: counter(second, "ownerback", "duplicate") >= 2, what="replay seen")
            assert second.solver.state.health == {"spot-GPU-0": "Unhealthy", "spot-GPU-1": "Unhealthy"}
            assert second.solver.state.borrowers() == {} and len(bridge.ops("detect")) == 1
            assert len(bridge.ops("release")) == 1
        assert await stored_count(world, bus.subjects.eviction(NODE)) == 2
        assert len({r.id for r in records.of(EvictionRecord)}) == 2


async def test_pressure_evicts_the_lowest_priority_oversold_pod(
    nats_settings: NatsSettings, kube_api: KubeApi, kube: Kube, containerd: Containerd, rootfs: Path,
    kubelet: Kubelet,
    bridge: FakeBridge,
) -> None:
    gib = 1 << 30
    async with client_bus(nats_settings) as bus, \
            solver(nats_settings, kube_api.kubeconfig, solver_settings(containerd, kubelet), kube):
        world = World(containerd, rootfs, kube, bus, NODE, kubelet)
        records = Recorder()
        await bus.subscribe(bus.subjects.eviction(NODE), records)
        vmem = {"gpushare/vmem": "2"}
        await world.add_pod("batch/low", ["low-main"], requests=vmem, priority=0)
        await world.add_pod("batch/high", ["high-main"], requests=vmem, priority=100)
        await world.add_pod("batch/plain", ["plain-main"])
        sample = SpareCapacity(node=NODE, resource="vmem", devices=0, unit=gib, inputs={
            "node_cpu_used_m": 100.0, "node_cpu_total_m": 4000.0,
            "node_memory_used": 12.0 * gib, "node_memory_total": 16.0 * gib})
        await bus.publish(bus.subjects.capacity(NODE, "vmem"), sample)
        await wait_for(lambda: len(records.events) == 1, what="one pressure eviction")
        record = records.of(EvictionRecord)[0]
        assert (record.pod, record.reason, record.outcome) == ("batch/low", "pressure", "evicted")  # type: ignore[attr-defined]
        assert world.task_status("low-main") == "STOPPED"
        assert world.task_status("high-main") == "RUNNING" == world.task_status("plain-main")
        assert not await world.pod_exists("batch/low") and await world.pod_exists("batch/high")
