"""The detector against real servers: nats-server, the Kubernetes API emulator, a pod-resources socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import kubernetes
import pytest
from gpushare_common import events as ev
from gpushare_common.adapters.kube import Kube, PodChange
from gpushare_common.bus import Bus
from gpushare_common.settings import KubeSettings, NatsSettings
from gpushare_detector.detector import Detector

from tests.detector import podfactory as pf
from tests.detector.harness import NODE, Collector, KmodBridge, build, is_, stream_messages
from tests.detector.podres_server import PodResourcesServer
from tests.support.kubeapi import KubeApi


@dataclass
class World:
    bus: Bus
    api: KubeApi
    core: kubernetes.client.CoreV1Api
    podres: PodResourcesServer
    bridge: KmodBridge
    seen: Collector

    async def create(self, pod: dict[str, object], phase: str = "Running") -> None:
        meta = pod["metadata"]
        assert isinstance(meta, dict)
        await asyncio.to_thread(self.core.create_namespaced_pod, meta["namespace"], pod)  # type: ignore[arg-type]
        if phase != "Pending":
            await asyncio.to_thread(self.core.patch_namespaced_pod_status, meta["name"], meta["namespace"],
                                    {"status": {"phase": phase}})

    async def delete(self, name: str, grace: int = 0, namespace: str = "ns") -> None:
        await asyncio.to_thread(self.core.delete_namespaced_pod, name, namespace, grace_period_seconds=grace)


@pytest.fixture
async def world(nats_settings: NatsSettings, kube_api: KubeApi, podresources: PodResourcesServer
                ) -> AsyncIterator[World]:
    bus = Bus(nats_settings, "detector-test")
    await bus.connect()
    await bus.wait_for_stream()
    bridge, seen = KmodBridge(), Collector()
    await bus.serve(bus.subjects.node_kmod(NODE), bridge.respond)
    await bus.subscribe(bus.subjects.node_events(NODE), seen)
    core = kubernetes.client.CoreV1Api(kube_api.client)
    await asyncio.to_thread(core.create_namespace, {"metadata": {"name": "ns"}})  # type: ignore[arg-type]
    yield World(bus, kube_api, core, podres=podresources, bridge=bridge, seen=seen)
    await bus.drain()


@pytest.fixture
async def running(world: World) -> AsyncIterator[Detector]:
    detector = build(world.bus, str(world.podres.socket))
    kube = Kube(KubeSettings(kubeconfig=str(world.api.kubeconfig), watch_timeout_s=30))
    stop = asyncio.Event()
    tasks = [asyncio.create_task(detector.watch(kube.watch_pods(stop, field_selector=f"spec.nodeName={NODE}"))),
             asyncio.create_task(detector.kmod.run(stop))]
    await asyncio.wait_for(detector.synced.wait(), 10)
    yield detector
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    await detector.devices.close()  # type: ignore[attr-defined]
    await kube.close()


async def test_pods_become_events_and_clear(world: World, running: Detector) -> None:
    world.podres.table["ns/dev"] = {"main": {"nvidia.com/gpu": ("G1",)}, "dind": {}}
    await world.create(pf.reserved("dev", lendable=True))
    using = await world.seen.wait_for(is_(ev.ReservedEvent, pod="ns/dev", state="using"))
    assert isinstance(using, ev.ReservedEvent) and using.devices == ("G1",) and using.lendable
    await _until(lambda: world.bridge.containers() == {"ns/dev/main"})

    world.podres.table[f"{pf.SYSTEM}/s1"] = {"main": {"nvidia.com/gpu": ("G2",)}}
    await world.create(pf.shadow("s1", spec=4))
    shadow = await world.seen.wait_for(is_(ev.ShadowEvent, shadow_pod=f"{pf.SYSTEM}/s1", state="running"))
    assert isinstance(shadow, ev.ShadowEvent) and shadow.devices == ("G2",) and shadow.resource == "share-gpu-4"

    world.podres.table["ns/app"] = {"app": {"gpushare/share-gpu-4": ("ns/s1-0",)}}
    await world.create(pf.share("app"))
    share = await world.seen.wait_for(is_(ev.ShareEvent, share_pod="ns/app", state="using"))
    assert isinstance(share, ev.ShareEvent) and share.devices == ("ns/s1-0",)
    await _until(lambda: world.bridge.containers() == {"ns/dev/main", "ns/app/app"})  # a sharer: counted too
    assert (world.bridge.placed["ns/app/app"].role, world.bridge.placed["ns/dev/main"].role) == ("sharer", "owner")

    await world.create(pf.reserved("elsewhere", node="node-2"))
    await world.delete("s1", grace=30, namespace=pf.SYSTEM)  # graceful: terminating first
    await world.seen.wait_for(is_(ev.ShadowEvent, shadow_pod=f"{pf.SYSTEM}/s1", terminating=True,
                                  state="running"))
    del world.podres.table["ns/dev"]
    await world.delete("dev")
    await world.seen.wait_for(is_(ev.ReservedEvent, pod="ns/dev", state="cleared"))
    await _until(lambda: world.bridge.containers() == {"ns/app/app"})
    assert "ns/elsewhere" not in running.tracker.views
    assert running.status()["pods"] == {"shadow": 1, "share": 1}


async def test_resync_and_a_restarted_detector_publish_nothing_new(world: World, running: Detector) -> None:
    world.podres.table["ns/dev"] = {"main": {"nvidia.com/gpu": ("G1",)}}
    world.podres.table["ns/job"] = {"job": {"gpushare/spot-gpu": ("spot-G3",)}}
    await world.create(pf.reserved("dev"))
    await world.create(pf.spot("job"))
    await world.seen.wait_for(is_(ev.SpotEvent, pod="ns/job", state="using"))
    await world.seen.wait_for(is_(ev.ReservedEvent, pod="ns/dev", state="using"))
    stored = await stream_messages(world.bus)
    assert await running.resync() == 2
    assert await stream_messages(world.bus) == stored  # JetStream dropped the duplicates

    # a second detector starting from scratch converges on the same ids
    fresh = build(world.bus, str(world.podres.socket))
    await fresh.on_change(PodChange("SYNC", pods=await _pods(world)))
    assert {e.id for e in fresh.tracker.current()} == {e.id for e in running.tracker.current()}
    assert await stream_messages(world.bus) == stored
    await fresh.devices.close()  # type: ignore[attr-defined]


async def test_pod_resources_outage_keeps_state_and_recovers(world: World, running: Detector) -> None:
    world.podres.table["ns/dev"] = {"main": {"nvidia.com/gpu": ("G1",)}}
    await world.create(pf.reserved("dev"))
    await world.seen.wait_for(is_(ev.ReservedEvent, pod="ns/dev", state="using"))
    await world.podres.server.stop(grace=None)
    await running.resync()  # List fails: the last devices are kept, nothing is cleared
    assert not any(getattr(e, "state", "") == "cleared" for e in world.seen.events)
    assert len(running.tracker.current()) == 1


async def _until(condition: object, timeout: float = 5.0) -> None:
    async def poll() -> None:
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), timeout)


async def test_a_restarted_detector_clears_pods_deleted_while_it_was_down(world: World) -> None:
    store = await world.bus.store("detector", world.bus.layout.scope(NODE, "fact"))
    world.podres.table["ns/dev"] = {"main": {"nvidia.com/gpu": ("G1",)}}
    world.podres.table["ns/job"] = {"job": {"gpushare/spot-gpu": ("spot-G3",)}}
    await world.create(pf.reserved("dev"))
    await world.create(pf.spot("job"))
    first = build(world.bus, str(world.podres.socket))
    await first.on_change(PodChange("SYNC", pods=await _pods(world)))
    assert await first.save_facts(store) == 2
    await first.devices.close()  # type: ignore[attr-defined]

    await world.delete("dev")  # while no detector runs
    del world.podres.table["ns/dev"]
    second = build(world.bus, str(world.podres.socket))
    assert second.tracker.restore(await store.items(list[ev.AnyEvent])) == 2
    await second.on_change(PodChange("SYNC", pods=await _pods(world)))
    gone = await world.seen.wait_for(is_(ev.ReservedEvent, pod="ns/dev", state="cleared"))
    assert gone.devices == ("G1",)  # type: ignore[union-attr]
    assert await second.save_facts(store) == 1
    assert await store.keys() == ["ns/job"]
    await second.devices.close()  # type: ignore[attr-defined]


async def _pods(world: World) -> list[dict[str, object]]:
    pods = await asyncio.to_thread(world.core.list_namespaced_pod, "ns")
    return [world.api.client.sanitize_for_serialization(p) for p in pods.items]  # type: ignore[no-untyped-call]


async def test_events_of_a_nats_outage_are_published_when_it_returns(
        subject_prefix: str, podresources: PodResourcesServer) -> None:
    """A pod change while NATS is away is not dropped until the next resync: the detector keeps
    publishing it until the stream has it."""
    from tests.support.nats import NatsServer

    server = NatsServer().start()
    try:
        nats = NatsSettings(url=server.url, prefix=f"{subject_prefix}.v1", stream=subject_prefix.upper(),
                            kv_prefix=subject_prefix, reconnect_wait_s=0.05, ensure_layout=True)
        bus = Bus(nats, "detector", node=NODE)
        await bus.connect()
        await bus.wait_for_stream()
        detector = build(bus, str(podresources.socket))
        await detector.on_change(PodChange("SYNC", pods=[]))
        podresources.table["ns/job"] = {"job": {"gpushare/spot-gpu": ("spot-GPU-0",)}}
        await asyncio.to_thread(server.stop)
        change = asyncio.create_task(detector.on_change(PodChange("ADDED", pod=pf.spot("job"))))
        await asyncio.sleep(0.3)
        assert not change.done() and detector.status()["unpublished"] == 1
        await asyncio.to_thread(server.start)
        await asyncio.wait_for(change, 20)
        stored = [m.event() for m in await bus.read_after(bus.subjects.node_events(NODE), 0)]
        assert any(isinstance(e, ev.SpotEvent) and e.pod == "ns/job" for e in stored), stored
        assert detector.status()["unpublished"] == 0
        await bus.drain()
    finally:
        server.cleanup()
