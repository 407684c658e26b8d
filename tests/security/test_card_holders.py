"""A card is never lent while a container holds it, whoever the solver was told holds it: before an
event that may lend a card, the solver asks the kubelet's pod-resources who holds what, and a
card held by a container it knows nothing of stays withheld (Unhealthy) until the kubelet lists
nothing holding it. The attack: a pod holding a card that the detector never reported (or the
SharePods of a ShadowPod gone) — the card was listed Healthy and lendable beside it."""

from __future__ import annotations

import pytest
from gpushare_common.bus import Bus
from gpushare_common.events import CardInventory, ShadowEvent
from gpushare_common.settings import NatsSettings

from tests.solver.conftest import NODE, FakeBridge, wait_for
from tests.solver.fakes import FakePods, FakeTasks
from tests.solver.test_service import publish_all, wired

GPU = "nvidia.com/gpu"
SHADOW = "gpushare-system/shadow-1"


def inventory(*cards: str) -> CardInventory:
    return CardInventory(node=NODE, vendor_resource=GPU, devices=cards)


def withheld(running: object, why: str) -> float:
    return float(running.solver.metrics.lend_withheld.labels(why)._value.get())  # type: ignore[attr-defined]


async def test_a_card_held_by_a_pod_nobody_reported_is_not_lent(nats_settings: NatsSettings,
                                                                 bridge: FakeBridge) -> None:
    pods = FakePods()
    pods.add("team-b/sneaky", NODE, ["s"], {GPU: ("GPU-1",)})  # the kubelet's word; no event says so
    bus = Bus(nats_settings, "test")
    await bus.connect()
    try:
        async with wired(nats_settings, pods, FakeTasks()) as running:
            await publish_all(bus, [inventory("GPU-0", "GPU-1")])
            await wait_for(lambda: running.solver.state.lent() == ["spot-GPU-0"], what="the free card lent")
            assert running.solver.state.health.get("spot-GPU-1") != "Healthy"
            assert withheld(running, "held") == 1
            del pods.allocated["team-b/sneaky"]  # the pod ends: the next inventory lends the card
            await publish_all(bus, [inventory("GPU-0", "GPU-1")])
            await wait_for(lambda: sorted(running.solver.state.lent()) == ["spot-GPU-0", "spot-GPU-1"],
                           what="the card lent once nothing holds it")
    finally:
        await bus.drain()


@pytest.mark.parametrize("holder", ["team-b/replayed", "team-a/orphan"])
async def test_the_cards_of_a_shadow_pod_gone_stay_withheld_while_a_container_holds_its_device(
        nats_settings: NatsSettings, bridge: FakeBridge, holder: str) -> None:
    """The ShadowPod retires (nobody reported using it), but the kubelet still lists a container
    holding one of its virtual devices: its card is not lent until that container is gone."""
    pods = FakePods()
    bus = Bus(nats_settings, "test")
    await bus.connect()
    try:
        async with wired(nats_settings, pods, FakeTasks()) as running:
            await publish_all(bus, [inventory("GPU-0"), ShadowEvent(
                node=NODE, shadow_pod=SHADOW, state="running", resource="share-gpu-2", share_spec=2,
                vendor_resource=GPU, devices=("GPU-0",))])
            await wait_for(lambda: running.solver.state.shadow_cards == {SHADOW: ("GPU-0",)}, what="the ShadowPod")
            pods.add(holder, NODE, ["h"], {"gpushare/share-gpu-2": (f"{SHADOW}-0",)})
            await publish_all(bus, [ShadowEvent(node=NODE, shadow_pod=SHADOW, state="cleared",
                                                resource="share-gpu-2")])
            await wait_for(lambda: running.solver.state.cache.get(SHADOW) is None, what="the ShadowPod gone")
            await publish_all(bus, [inventory("GPU-0")])
            await wait_for(lambda: running.solver.metrics.events.labels("inventory", "applied")._value.get() >= 2,
                           what="the inventory handled")
            assert running.solver.state.lent() == [] and running.solver.state.health.get("spot-GPU-0") != "Healthy"
            del pods.allocated[holder]
            await publish_all(bus, [inventory("GPU-0")])
            await wait_for(lambda: running.solver.state.lent() == ["spot-GPU-0"], what="lent once nobody holds it")
            assert running.solver.state.shadow_cards == {}
    finally:
        await bus.drain()
