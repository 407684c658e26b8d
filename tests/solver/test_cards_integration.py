"""Free cards against real servers: the card inventory on nats-server (JetStream) lends the cards no
pod holds; a card gone or taken by a ShadowPod kills and evicts its borrowers (runc containers in a
private containerd, pods in the API emulator). Then the same through a restart, wired in memory."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from gpushare_common.adapters.kube import Kube
from gpushare_common.bus import Bus, Store
from gpushare_common.events import CardInventory, DeviceHealth, EvictionRecord, ShadowEvent, SpotEvent
from gpushare_common.settings import NatsSettings
from gpushare_sim.containerd import Containerd

from tests.solver.conftest import NODE, FakeBridge, wait_for
from tests.solver.fakes import FakePods, FakeTasks
from tests.solver.test_integration import Recorder, http_json, solver
from tests.solver.test_service import publish_all, wired
from tests.solver.world import World, client_bus, solver_settings
from tests.support.kubeapi import KubeApi
from tests.support.kubelet import Kubelet

GPU = "nvidia.com/gpu"
SHADOW = "team/shadow-a"


def inventory(*cards: str) -> CardInventory:
    return CardInventory(node=NODE, vendor_resource=GPU, devices=cards)


def shadow_running(*cards: str) -> ShadowEvent:
    return ShadowEvent(node=NODE, shadow_pod=SHADOW, state="running", resource="share-gpu-2", share_spec=2,
                       vendor_resource=GPU, devices=cards)


def borrow(pod: str, card: str) -> SpotEvent:
    return SpotEvent(node=NODE, pod=pod, container="c0", state="using", devices=(f"spot-{card}",))


def spot_health(seen: Recorder) -> dict[str, str]:
    merged: dict[str, str] = {}
    for event in seen.of(DeviceHealth):
        assert isinstance(event, DeviceHealth)
        if event.resource == "spot-gpu":
            merged.update(event.devices)
    return merged


@pytest.mark.containerd
async def test_free_cards_lent_then_withdrawn_when_gone_or_taken(
    nats_settings: NatsSettings, kube_api: KubeApi, kube: Kube, containerd: Containerd, rootfs: Path,
    kubelet: Kubelet,
    bridge: FakeBridge,
) -> None:
    async with client_bus(nats_settings) as bus, \
            solver(nats_settings, kube_api.kubeconfig, solver_settings(containerd, kubelet), kube) as running:
        world = World(containerd, rootfs, kube, bus, NODE, kubelet)
        seen = Recorder()
        await bus.subscribe(bus.subjects.eviction(NODE), seen)
        await bus.subscribe(bus.subjects.node_health(NODE), seen)
        await world.publish("inventory", inventory("GPU-0", "GPU-1", "GPU-2"))
        await wait_for(lambda: spot_health(seen) == dict.fromkeys(["spot-GPU-0", "spot-GPU-1", "spot-GPU-2"],
                                                                  "Healthy"), what="free cards Healthy")
        await world.add_pod("spot/b0", ["b0-main"], devices={"gpushare/spot-gpu": ["spot-GPU-0"]})
        await world.add_pod("spot/b1", ["b1-main"], devices={"gpushare/spot-gpu": ["spot-GPU-1"]})
        await world.publish("spot", borrow("spot/b0", "GPU-0"))
        await world.publish("spot", borrow("spot/b1", "GPU-1"))
        await wait_for(lambda: len(running.solver.state.borrowers()) == 2, what="two borrowers")

        await world.publish("inventory", inventory("GPU-1", "GPU-2"))  # GPU-0 gone
        await wait_for(lambda: len(seen.of(EvictionRecord)) == 1, what="the borrower of the card gone evicted")
        await world.publish("shadow", shadow_running("GPU-1"))  # a ShadowPod takes a free card
        await wait_for(lambda: len(seen.of(EvictionRecord)) == 2, what="the borrower of the card taken evicted")

        records = {r.pod: r for r in seen.of(EvictionRecord) if isinstance(r, EvictionRecord)}
        assert (records["spot/b0"].reason, records["spot/b0"].outcome) == ("card-gone", "evicted")
        assert (records["spot/b1"].reason, records["spot/b1"].owner) == ("reserved", SHADOW)
        assert world.task_status("b0-main") == "STOPPED" == world.task_status("b1-main")
        assert not await world.pod_exists("spot/b0") and not await world.pod_exists("spot/b1")
        assert spot_health(seen) == {"spot-GPU-0": "Unhealthy", "spot-GPU-1": "Unhealthy", "spot-GPU-2": "Healthy"}
        status = await asyncio.to_thread(http_json, running.port, "/status")
        assert status["card_inventory"] == {GPU: ["GPU-1", "GPU-2"]}  # type: ignore[index]
        assert status["shadow_cards"] == {SHADOW: ["GPU-1"]}  # type: ignore[index]
        assert bridge.ops("release") == []


async def test_inventory_and_shadow_cards_survive_a_restart(nats_settings: NatsSettings, bridge: FakeBridge) -> None:
    pods, tasks = FakePods(), FakeTasks(running={"b2-c"})
    pods.add(SHADOW, NODE, ["s"])
    pods.add("spot/b2", NODE, ["b2-c"], {"gpushare/spot-gpu": ("spot-GPU-0",)})
    bus = Bus(nats_settings, "test")
    await bus.connect()
    try:
        async with wired(nats_settings, pods, tasks) as first:
            await publish_all(bus, [inventory("GPU-0", "GPU-1"), shadow_running("GPU-0")])
            await wait_for(lambda: first.solver.state.lent() == ["spot-GPU-1"], what="the free card lent")
        async with wired(nats_settings, pods, tasks) as second:
            assert second.solver.state.inventory == {GPU: ("GPU-0", "GPU-1")}
            assert second.solver.state.shadow_cards == {SHADOW: ("GPU-0",)}
            await publish_all(bus, [borrow("spot/b2", "GPU-0")])  # a borrower on the ShadowPod's card
            await wait_for(lambda: pods.deleted == ["spot/b2"], what="the borrower evicted")
            assert "b2-c" not in tasks.running
            again = inventory("GPU-0", "GPU-1")
            for _ in range(2):  # the same inventory twice: applied both times (idempotent by content)
                await bus.publish(bus.subjects.event(NODE, "inventory"), again)
            await wait_for(lambda: second.solver.metrics.events.labels("inventory", "applied")._value.get() >= 2,
                           what="the republished inventory applied")
            assert second.solver.state.health == {"spot-GPU-0": "Unhealthy", "spot-GPU-1": "Healthy"}
    finally:
        await bus.drain()


async def test_a_stop_mid_event_writes_its_state_whole(nats_settings: NatsSettings, bridge: FakeBridge) -> None:
    """Stopped while the state of an event is being written (the ShadowPod's mapping entry not yet
    in its bucket), the solver finishes the write before it stops: restarted, it still knows the
    ShadowPod, and the next inventory does not lend the ShadowPod's card."""
    pods, tasks = FakePods(), FakeTasks()
    pods.add(SHADOW, NODE, ["s"])
    async with wired(nats_settings, pods, tasks) as first:
        await first.solver.on_event(inventory("GPU-0", "GPU-1"))
        gate = hold_put(first.solver._stores["mapping"], SHADOW)
        handling = asyncio.create_task(first.solver.on_event(shadow_running("GPU-0")))
        await asyncio.wait_for(gate.reached.wait(), timeout=10.0)
        handling.cancel()  # as the service's stop does to its events task
        gate.release.set()
        with pytest.raises(asyncio.CancelledError):
            await handling
    async with wired(nats_settings, pods, tasks) as second:
        assert second.solver.state.cache.get(SHADOW) is not None
        await second.solver.on_event(inventory("GPU-0", "GPU-1"))
        assert second.solver.state.health == {"spot-GPU-0": "Unhealthy", "spot-GPU-1": "Healthy"}


class Gate:
    """Holds a write until released; ``reached`` once the write is held."""

    def __init__(self) -> None:
        self.reached, self.release = asyncio.Event(), asyncio.Event()


def hold_put(store: Store, key: str) -> Gate:
    """Hold ``store``'s write of ``key`` until the gate is released."""
    gate, original = Gate(), store.put

    async def held(name: str, value: object) -> int:
        if name == key:
            gate.reached.set()
            await gate.release.wait()
        return await original(name, value)

    store.put = held  # type: ignore[method-assign]
    return gate
