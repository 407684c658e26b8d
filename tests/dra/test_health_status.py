"""ResourceHealthStatus (KEP-4680) end to end: the driver's DRAResourceHealth stream, the sim
kubelet's allocatedResourcesStatus in each container's status, read back with a real kubectl;
and, since kubectl describe prints no allocatedResourcesStatus, the driver's Events on the pods
it shows. An unhealthy card and a spot device taken back by its owner are both there."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from gpushare_common import dra, events
from gpushare_common.settings import NatsSettings
from gpushare_sim.node.health import DeviceHealth, container_status
from gpushare_sim.node.testing import wait_until

from tests.dra.harness import DraNode, dra_node
from tests.sim.conftest import kubectl_binary  # noqa: F401  (the fixture)
from tests.sim.kubectl import Kubectl
from tests.support.kubeapi import (
    KubeApi,
    kube_api,  # noqa: F401  (the fixture)
)

SHARE = {"deviceClassName": dra.SHARE_CLASS, "capacity": {"requests": {dra.SHARES: "25"}}}
SPOT = {"deviceClassName": dra.SPOT_CLASS}


def test_a_containers_status_lists_its_claims_devices_unknown_until_reported() -> None:
    from gpushare_sim.node.health import AllocatedDevice

    health = DeviceHealth()
    card = AllocatedDevice("gpushare.k8s.io", "n1", "gpu-0", ("gpushare.k8s.io/gpu=share.u.GPU-0",))
    bare = AllocatedDevice("other.example.com", "n1", "nic-1")
    claims = [("gpu", "", [card]), ("net", "nic", [bare]), ("empty", "", [])]
    assert container_status(claims, health) == [
        {"name": "claim:gpu", "resources": [{"resourceID": card.cdi_ids[0], "health": "Unknown"}]},
        {"name": "claim:net/nic", "resources": [{"resourceID": "other.example.com/n1/nic-1", "health": "Unknown"}]}]
    assert health.update("gpushare.k8s.io", [("n1", "gpu-0", "Unhealthy")]) == {card.key}
    assert health.update("gpushare.k8s.io", [("n1", "gpu-0", "Unhealthy")]) == set()
    assert container_status(claims[:1], health)[0]["resources"][0]["health"] == "Unhealthy"
    assert health.clear("gpushare.k8s.io") == {card.key} and health.get(card.key) == "Unknown"


async def resource_health(kubectl: Kubectl, pod: str) -> list[dict[str, Any]]:
    done = await asyncio.to_thread(kubectl.run, "get", "pod", pod, "-o",
                                   "jsonpath={.status.containerStatuses[0].allocatedResourcesStatus}")
    return json.loads(done.stdout) if done.returncode == 0 and done.stdout else []


async def health_of(kubectl: Kubectl, pod: str) -> str | None:
    found = await resource_health(kubectl, pod)
    return found[0]["resources"][0]["health"] if found and found[0]["resources"] else None


async def test_an_unhealthy_card_and_a_spot_device_taken_back_reach_the_pods_status(
        kube_api: KubeApi, nats_settings: NatsSettings, kubectl_binary: Path) -> None:  # noqa: F811
    kubectl = Kubectl(kubectl_binary, kube_api.kubeconfig)
    async with dra_node(kube_api, nats_settings, gpus=2) as node:
        await wait_until(node.slice_devices, 15, "the node's slice")
        await node.classes()
        await node.template("quarter", SHARE)
        await node.template("spot", SPOT)
        await node.pod("share", "quarter")
        await node.running("share")
        (entry,) = await wait_until(lambda: resource_health(kubectl, "share"), 15, "the share's device health")
        assert entry["name"] == "claim:gpu" and entry["resources"][0]["health"] == "Healthy"
        assert dra.parse_cdi_device(entry["resources"][0]["resourceID"]).role == dra.ROLE_SHARE
        card = dra.parse_cdi_device(entry["resources"][0]["resourceID"]).card
        await node.sim.vendor.set_health(card, False)  # type: ignore[union-attr]
        await wait_until(lambda: _is(kubectl, "share", "Unhealthy"), 15, "the unhealthy card in the pod's status")
        await wait_until(lambda: described(kubectl, "share", "DeviceUnhealthy"), 15, "the Event kubectl describe shows")
        other = next(c.id for c in node.driver.inventory.cards if c.id != card)
        await lend(node, other, "Healthy")
        await node.pod("borrower", "spot")
        await node.running("borrower")
        await wait_until(lambda: _is(kubectl, "borrower", "Healthy"), 15, "the lent spot device Healthy")
        await lend(node, other, "Unhealthy")  # its owner is back: the solver takes the spot device back
        await wait_until(lambda: _is(kubectl, "borrower", "Unhealthy"), 15, "the spot device taken back")
        text = await wait_until(lambda: described(kubectl, "borrower", "SpotTakenBack"), 15, "the taken-back Event")
        assert "the card's owner is back" in text


async def lend(node: DraNode, card: str, health: str) -> None:
    """The solver's desired health of the card's spot device, as the driver receives it."""
    await node.driver._on_event(events.DeviceHealth(node=node.name, resource="spot-gpu",
                                                    devices={f"spot-{card}": health}))  # type: ignore[dict-item]


async def _is(kubectl: Kubectl, pod: str, health: str) -> bool:
    return await health_of(kubectl, pod) == health


async def described(kubectl: Kubectl, pod: str, reason: str) -> str | None:
    """``kubectl describe pod`` (its Events) once it shows ``reason``."""
    done = await asyncio.to_thread(kubectl.run, "describe", "pod", pod)
    return done.stdout if done.returncode == 0 and reason in done.stdout else None


def test_each_health_change_of_a_claims_device_is_told_once() -> None:
    from gpushare_dra_driver.healthevents import HEALTHY, TAKEN_BACK, UNHEALTHY, changes, pods_of
    from gpushare_dra_driver.state import PreparedClaim, PreparedDevice

    def claim(uid: str, device: str) -> PreparedClaim:
        return PreparedClaim(namespace="ml", name=f"c-{uid}", uid=uid, file="f", spec={}, devices=(
            PreparedDevice(requests=("gpu",), pool="n1", device=device, cdi_ids=()),))

    told: dict[tuple[str, str], bool] = {}
    claims = [claim("a", "gpu-0"), claim("b", "spot-gpu-1")]
    assert changes(claims, {"gpu-0": True, "spot-gpu-1": True}, told) == []  # first seen healthy: no news
    found = changes(claims, {"gpu-0": False, "spot-gpu-1": False}, told)
    assert [(n.claim, n.reason) for n in found] == [("c-a", UNHEALTHY), ("c-b", TAKEN_BACK)]
    assert changes(claims, {"gpu-0": False, "spot-gpu-1": False}, told) == []  # told once
    assert [n.reason for n in changes(claims[:1], {"gpu-0": True}, told)] == [HEALTHY]
    assert set(told) == {("a", "gpu-0")}, "a claim gone is forgotten"
    assert pods_of({"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}, {"name": ""}]}}) == [
        ("p", "u")]
