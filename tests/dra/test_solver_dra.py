"""The solver on a DRA node: the driver's card inventory beside the detector's empty one, and
the NoExecute taint of an owner-back spot device, through the API emulator."""

from __future__ import annotations

import pytest
from gpushare_common import dra
from gpushare_common.adapters.kube import TAINT_API, NotFound, resource_path
from gpushare_common.cardmap import card_map
from gpushare_common.events import CardInventory, SpotEvent
from gpushare_common.subjects import Subjects
from gpushare_sim.node.adapters.kube import SimKube
from gpushare_solver.actions import Plan, Reclaim, SetHealth
from gpushare_solver.executor import Executor
from gpushare_solver.handlers import handle
from gpushare_solver.settings import SolverSettings
from gpushare_solver.spot import OWNER_BACK
from gpushare_solver.state import DRA_SHARES, SolverState
from gpushare_solver.taints import TAINT_KEY, DeviceTaints, rule_name, taint_rule

from tests.support.kubeapi import (
    KubeApi,
    kube_api,  # noqa: F401  (the fixture)
)

NODE = "gpu-node-2"


def test_the_drivers_inventory_stands_beside_the_detectors_empty_one() -> None:
    state = SolverState()
    lent = handle(CardInventory(node=NODE, vendor_resource=f"{dra.DRIVER}/nvidia.com/gpu",
                                devices=("GPU-0", "GPU-1")), state)
    assert [a.devices for a in lent if isinstance(a, SetHealth)] == [{"spot-GPU-0": "Healthy",
                                                                       "spot-GPU-1": "Healthy"}]
    after = handle(CardInventory(node=NODE, vendor_resource="nvidia.com/gpu", devices=()), state)
    assert not [a for a in after if isinstance(a, SetHealth)], "the kubelet's empty inventory withdraws nothing"
    assert sorted(state.lent()) == ["spot-GPU-0", "spot-GPU-1"]


def test_cards_the_drivers_share_claims_use_are_not_lent_until_no_share_does() -> None:
    """Shares prepared on a lent card (a spot claim took its mirror meanwhile): its spot device is
    withdrawn and the borrower reclaimed as from a card a ShadowPod takes; the card is shared in
    the solver's map; lent again once no share uses it."""
    state, resource = SolverState(), f"{dra.DRIVER}/nvidia.com/gpu"
    handle(CardInventory(node=NODE, vendor_resource=resource, devices=("GPU-0", "GPU-1")), state)
    handle(SpotEvent(node=NODE, pod="ml/spot", container="main", state="using", devices=("spot-GPU-0",),
                     pod_uid="u-spot"), state)  # fmt: skip
    shared = handle(CardInventory(node=NODE, vendor_resource=resource, devices=("GPU-0", "GPU-1"),
                                  shared=("GPU-0",)), state)  # fmt: skip
    assert [a.devices for a in shared if isinstance(a, SetHealth)] == [{"spot-GPU-0": "Unhealthy"}]
    (reclaim,) = [a for a in shared if isinstance(a, Reclaim)]
    assert (reclaim.pods, reclaim.reason, reclaim.owner) == (("ml/spot",), "reserved", DRA_SHARES)
    cards = {c.card: c for c in card_map(state.cache, state.inventory, state.shadow_cards, state.health,
                                         state.dra_shared)}  # fmt: skip
    assert (cards["GPU-0"].state, cards["GPU-0"].spot_health, cards["GPU-1"].state) == ("shared", "Unhealthy", "idle")
    freed = handle(CardInventory(node=NODE, vendor_resource=resource, devices=("GPU-0", "GPU-1")), state)
    assert [a.devices for a in freed if isinstance(a, SetHealth)] == [{"spot-GPU-0": "Healthy"}]
    assert state.dra_shared == {}


def test_the_taint_rule_selects_the_spot_device_of_the_drivers_pool() -> None:
    rule = taint_rule(NODE, "spot-GPU-gpu-node-2-3", "dev/devmachine")
    assert rule["metadata"]["name"] == rule_name(NODE, "spot-GPU-gpu-node-2-3") == \
        "gpushare-owner-back-gpu-node-2-spot-gpu-gpu-node-2-3"
    assert rule["spec"] == {"deviceSelector": {"driver": dra.DRIVER, "pool": NODE, "device": "spot-gpu-gpu-node-2-3"},
                            "taint": {"key": TAINT_KEY, "value": "dev.devmachine", "effect": "NoExecute"}}


async def test_taint_and_untaint_through_the_api(kube_api: KubeApi) -> None:  # noqa: F811
    kube = SimKube.from_kubeconfig(str(kube_api.kubeconfig))
    taints = DeviceTaints(NODE, kube)
    path = resource_path("devicetaintrules", name=rule_name(NODE, "spot-GPU-0"), api=TAINT_API)
    try:
        await taints.taint(["spot-GPU-0", "not-a-spot-device"], "dev/owner")
        await taints.taint(["spot-GPU-0"], "dev/owner")  # already tainted: no error
        assert (await kube.get_object(path))["spec"]["taint"]["effect"] == "NoExecute"
        await taints.untaint(["spot-GPU-0", "spot-GPU-9"])
        with pytest.raises(NotFound):
            await kube.get_object(path)
    finally:
        await kube.close()


class Recorder:
    """The taints port and the reclaimer, recording the order things happen in."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.settings = SolverSettings()

    async def taint(self, devices: list[str], owner: str) -> None:
        self.calls.append(("taint", tuple(devices)))

    async def untaint(self, devices: list[str]) -> None:
        self.calls.append(("untaint", tuple(devices)))

    async def run(self, action: Reclaim, progress: object, trigger: str, received: float, save: object) -> None:
        self.calls.append(("reclaim", action.pods))


class Outbox:
    async def publish(self, subject: str, event: object) -> None:
        return None


async def test_the_executor_taints_after_the_owner_back_reclaim_and_untaints_when_lent() -> None:
    recorder = Recorder()
    executor = Executor(NODE, Subjects(), None, Outbox(), recorder, recorder)  # type: ignore[arg-type]
    withdrawn = SetHealth(resource="spot-gpu", devices={"spot-GPU-3": "Unhealthy"}, reason="owner back")
    plan = Plan(trigger_id="t", event="ownerback", actions=[
        withdrawn, Reclaim(reason=OWNER_BACK, pods=("dev/borrower",), owner="dev/devmachine")])

    async def save(_: Plan) -> None:
        return None

    await executor.run(plan, save)
    assert recorder.calls == [("reclaim", ("dev/borrower",)), ("taint", ("spot-GPU-3",))]
    reserved = Plan(trigger_id="u", event="generic", actions=[
        SetHealth(resource="spot-gpu", devices={"spot-GPU-1": "Unhealthy"}), Reclaim(reason="reserved")])
    await executor.run(reserved, save)
    assert recorder.calls[-1] == ("reclaim", ()), "only an owner-back taints"
    await executor.apply(SetHealth(resource="spot-gpu", devices={"spot-GPU-3": "Healthy"}))
    assert recorder.calls[-1] == ("untaint", ("spot-GPU-3",))
