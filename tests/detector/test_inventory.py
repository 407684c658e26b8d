"""The card inventory: pure updates and ids, the pod-resources call over real gRPC (the test server
and the node simulator's), and the detector publishing it on a real nats-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from gpushare_common import events as ev
from gpushare_common.adapters.kube import PodChange
from gpushare_common.adapters.podresources import PodResources, PodResourcesError
from gpushare_common.bus import Bus
from gpushare_common.settings import NatsSettings
from gpushare_detector.detector import Detector
from gpushare_detector.inventory import INVENTORY_KEY, Inventory
from gpushare_sim.fakegpu.cards import VENDOR_RESOURCE
from gpushare_sim.node.adapters.podresources import PodResourcesServer as SimPodResources
from gpushare_sim.node.devices import DeviceTable
from hypothesis import given
from hypothesis import strategies as st

from tests.detector import podfactory as pf
from tests.detector.harness import NODE, Collector, build, is_, stream_messages
from tests.detector.podres_server import PodResourcesServer

GPU = "nvidia.com/gpu"
CARDS = st.lists(st.sampled_from(["G0", "G1", "G2", "G3"]), max_size=4)


def test_update_publishes_each_vendor_resource_once_per_change() -> None:
    inventory = Inventory(NODE, (GPU, "hygon.com/dcu"))
    first = inventory.update({GPU: ("G1", "G0"), "other.com/x": ("X",)})
    assert [(e.vendor_resource, e.devices) for e in first] == [(GPU, ("G0", "G1")), ("hygon.com/dcu", ())]
    assert inventory.update({GPU: ("G0", "G1")}) == []
    assert inventory.dirty and [e.id for e in inventory.current()] == [e.id for e in first]


def test_coming_back_to_an_earlier_inventory_gets_a_new_id() -> None:
    inventory = Inventory(NODE, (GPU,))
    (a,) = inventory.update({GPU: ("G0", "G1")})
    (b,) = inventory.update({GPU: ("G1",)})
    (again,) = inventory.update({GPU: ("G0", "G1")})
    assert again.devices == a.devices and len({a.id, b.id, again.id}) == 3
    fresh = Inventory(NODE, (GPU,))  # a detector starting from nothing agrees on the first id
    assert fresh.update({GPU: ("G1", "G0")})[0].id == a.id


def test_restore_takes_the_saved_inventories_of_configured_resources() -> None:
    inventory = Inventory(NODE, (GPU,))
    (saved,) = inventory.update({GPU: ("G0",)})
    other = ev.CardInventory(node=NODE, vendor_resource="x.com/y", devices=("Y",))
    restarted = Inventory(NODE, (GPU,))
    assert restarted.restore({INVENTORY_KEY: [saved, other], "ns/pod": []}) == 1
    assert restarted.update({GPU: ("G0",)}) == [] and restarted.current() == [saved]


@given(st.lists(CARDS, min_size=1, max_size=8))
def test_ids_follow_the_content_and_the_history(history: list[list[str]]) -> None:
    inventory = Inventory(NODE, (GPU,))
    ids: list[str] = []
    previous: tuple[str, ...] | None = None
    for cards in history:
        changed = inventory.update({GPU: tuple(cards)})
        now = tuple(sorted(set(cards)))
        assert inventory.current()[0].devices == now
        assert len(changed) == (1 if now != previous else 0)
        ids.extend(e.id for e in changed)
        previous = now
    assert len(ids) == len(set(ids))  # never an id twice, even when an inventory comes back


async def test_allocatable_over_real_grpc(podresources: PodResourcesServer) -> None:
    client = PodResources(str(podresources.socket), timeout_s=2)
    try:
        with pytest.raises(PodResourcesError, match=r"GetAllocatableResources.*UNIMPLEMENTED"):
            await client.allocatable()
        podresources.lister.allocatable = {GPU: ("G2", "G0", "G1"), "gpushare/spot-gpu": ("spot-G0",)}
        assert await client.allocatable() == {GPU: ("G0", "G1", "G2"), "gpushare/spot-gpu": ("spot-G0",)}
    finally:
        await client.close()


async def test_allocatable_from_the_node_simulator(tmp_path: Path) -> None:
    table = DeviceTable()
    table.set_devices(VENDOR_RESOURCE, {"GPU-node-1-0": True, "GPU-node-1-1": False, "GPU-node-1-2": True})
    server = SimPodResources(tmp_path / "kubelet.sock", table, lambda: [])
    await server.start()
    client = PodResources(str(tmp_path / "kubelet.sock"))
    try:
        assert await client.allocatable() == {VENDOR_RESOURCE: ("GPU-node-1-0", "GPU-node-1-2")}
    finally:
        await client.close()
        await server.stop()


@pytest.fixture
async def bus(nats_settings: NatsSettings) -> AsyncIterator[Bus]:
    client = Bus(nats_settings, "detector-test")
    await client.connect()
    await client.wait_for_stream()
    yield client
    await client.drain()


@pytest.fixture
async def detector(bus: Bus, podresources: PodResourcesServer) -> AsyncIterator[Detector]:
    built = build(bus, str(podresources.socket))
    yield built
    await built.devices.close()  # type: ignore[attr-defined]


async def test_published_after_the_pods_on_start_on_change_and_on_resync(
    bus: Bus, detector: Detector, podresources: PodResourcesServer,
) -> None:
    seen = Collector()
    await bus.subscribe(bus.subjects.node_events(NODE), seen)
    podresources.table["ns/dev"] = {"main": {GPU: ("G1",)}}
    podresources.lister.allocatable = {GPU: ("G0", "G1")}
    await detector.on_change(PodChange("SYNC", pods=[pf.reserved("dev")]))
    first = await seen.wait_for(is_(ev.CardInventory, devices=("G0", "G1")))
    kinds = [type(e) for e in seen.events]
    assert kinds.index(ev.ReservedEvent) < kinds.index(ev.CardInventory)  # holders first
    assert first.id == detector.inventory.current()[0].id

    podresources.lister.allocatable = {GPU: ("G1",)}
    await detector.publish_inventory()
    gone = await seen.wait_for(is_(ev.CardInventory, devices=("G1",)))
    stored = await stream_messages(bus)
    await detector.resync()
    await detector.publish_inventory()
    assert await stream_messages(bus) == stored  # same inventory, same id: JetStream dropped it
    assert detector.status()["card_inventory"] == {GPU: ["G1"]}

    store = await bus.store("detector", bus.layout.scope(NODE, "fact"))
    await detector.save_facts(store)
    restarted = build(bus, str(podresources.socket))
    restarted.inventory.restore(await store.items(list[ev.AnyEvent]))
    podresources.lister.allocatable = {GPU: ("G0", "G1")}
    (back,) = await restarted.inventory.refresh(restarted.devices, restarted.metrics)  # type: ignore[arg-type]
    assert back.id not in (first.id, gone.id)  # the card came back: new news
    await restarted.devices.close()  # type: ignore[attr-defined]


async def test_an_unreadable_inventory_publishes_nothing_and_polls_until_stopped(
    bus: Bus, detector: Detector, podresources: PodResourcesServer,
) -> None:
    seen = Collector()
    await bus.subscribe(bus.subjects.node_events(NODE), seen)
    await detector.on_change(PodChange("SYNC", pods=[]))
    assert detector.inventory.current() == [] and detector.inventory.error
    stop = asyncio.Event()
    loop = asyncio.create_task(detector.inventory_loop(stop, 0.05))
    podresources.lister.allocatable = {GPU: ("G0",)}
    await seen.wait_for(is_(ev.CardInventory, devices=("G0",)))
    stop.set()
    await asyncio.wait_for(loop, 5)
    assert detector.inventory.error == ""


async def test_no_inventory_while_the_holders_are_unknown(
    bus: Bus, detector: Detector, podresources: PodResourcesServer,
) -> None:
    seen = Collector()
    await bus.subscribe(bus.subjects.node_events(NODE), seen)
    podresources.lister.allocatable = {GPU: ("G0", "G1")}
    podresources.lister.list_fails = True  # who holds which card is unknown: lending would be a guess
    await detector.on_change(PodChange("SYNC", pods=[pf.reserved("dev")]))
    await detector.publish_inventory()
    assert detector.inventory.current() == []
    podresources.lister.list_fails = False
    podresources.table["ns/dev"] = {"main": {GPU: ("G1",)}}
    await detector.resync()
    await seen.wait_for(is_(ev.CardInventory, devices=("G0", "G1")))
    kinds = [type(e) for e in seen.events]
    assert kinds.index(ev.ReservedEvent) < kinds.index(ev.CardInventory)
