"""A plan in the solver's bucket is data: the solver verifies every pod before it kills or deletes
it (taken out of the mapping cache by its own handler, on its node, with the recorded uid). A
forged plan is refused and counted, never executed. And no kill rests on one service's word: a
SpotEvent forged with the detector's identity puts a pod on record, but the kubelet, asked at the
reclaim, does not confirm that it holds the device — refused and counted, the pod lives."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from gpushare_common.adapters.kube import Kube, NotFound, Retryable
from gpushare_common.bus import Bus
from gpushare_common.events import CardInventory, SpotEvent
from gpushare_common.settings import NatsSettings
from gpushare_solver import app
from gpushare_solver.actions import Plan, Reclaim, Release
from gpushare_solver.confirm import unconfirmed
from gpushare_solver.pressure import PRESSURE
from gpushare_solver.reclaim import Seen, refusal
from gpushare_solver.settings import SolverSettings
from gpushare_solver.state import Victim

from tests.solver.conftest import NODE, FakeBridge, wait_for
from tests.solver.fakes import FakeTasks
from tests.solver.world import common_settings
from tests.support.kubeapi import KubeApi
from tests.support.kubelet import Kubelet


def test_refusal_table() -> None:
    mine = Victim(uid="u1")
    assert refusal(mine, Seen("u1", NODE), NODE) == ""
    assert refusal(mine, None, NODE) == ""  # gone: nothing to do
    assert refusal(None, Seen("u1", NODE), NODE) == "not-taken-out-of-the-cache"
    assert refusal(mine, Seen("u1", "node-b"), NODE) == "on-another-node"
    assert refusal(mine, Seen("u2", NODE), NODE) == "uid-mismatch"  # recreated under the same name
    assert refusal(Victim(), Seen("u9", NODE), NODE) == ""  # no uid recorded: the node decides
    assert refusal(mine, Seen("", "", malformed="spec.priority"), NODE) == "malformed-pod"  # who is it?


def test_unconfirmed_table() -> None:
    borrower = Victim(uid="u1", devices=("spot-GPU-0",))
    assert unconfirmed(borrower, frozenset({"spot-GPU-0"}), frozenset({"spot-GPU-0"})) == ""
    assert unconfirmed(borrower, None, frozenset()) == "not-on-this-kubelet"
    assert unconfirmed(borrower, frozenset({"spot-GPU-1"}), frozenset({"spot-GPU-1"})) == "not-holding-its-devices"
    assert unconfirmed(borrower, frozenset(), frozenset()) == "not-holding-its-devices"
    pressure = Victim(uid="u2")  # recorded with no device: any gpushare device of the pod will do
    assert unconfirmed(pressure, frozenset({"vmem-3"}), frozenset({"vmem-3"})) == ""
    assert unconfirmed(pressure, frozenset({"GPU-0"}), frozenset()) == "holds-no-gpushare-device"


async def create_pod(kube: Kube, key: str, node: str) -> str:
    namespace, name = key.split("/")
    body = {"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [
        {"name": "main", "image": "busybox"}]}}
    created = await kube.create_pod(namespace, body)
    return str(created["metadata"]["uid"])


@contextlib.asynccontextmanager
async def solver(nats: NatsSettings, kube_api: KubeApi, kube: Kube, kubelet: Kubelet) -> AsyncIterator[app.Service]:
    stop = asyncio.Event()
    settings = SolverSettings(ack_wait_s=2.0, retry_first_s=0.05, retry_max_s=0.5,
                              pod_resources_socket=str(kubelet.socket))
    async with app.Service(common_settings(nats, kube_api.kubeconfig, NODE), settings, stop, pods=kube,
                           tasks_api=FakeTasks()).started() as running:  # fmt: skip
        yield running
        stop.set()


async def forge(nats: NatsSettings, plan: Plan) -> None:
    """Write a plan into the solver's bucket as a compromised writer of it would."""
    bus = Bus(nats, "test")
    await bus.connect()
    await bus.wait_for_stream()
    store = await bus.store("solver", bus.layout.scope(NODE, "plan"))
    await store.put(plan.trigger_id, plan)
    await bus.drain()


def refused(running: app.Service, why: str) -> float:
    return float(running.solver.metrics.refused.labels(why)._value.get())


@pytest.mark.parametrize(("victim", "node", "why"), [
    ("kube-system/coredns-7d8f", "node-b", "not-taken-out-of-the-cache"),  # another node's pod
    ("apps/web", NODE, "not-taken-out-of-the-cache"),  # this node's, never a borrower or sharer
])
async def test_a_forged_plan_is_refused_and_counted(
    victim: str, node: str, why: str, nats_settings: NatsSettings, kube_api: KubeApi, kube: Kube,
    bridge: FakeBridge, kubelet: Kubelet,
) -> None:
    await create_pod(kube, victim, node)
    await forge(nats_settings, Plan(trigger_id="forged-1", event="ownerback", actions=[
        Reclaim(reason="owner-back", pods=(victim,), owner="dev/x", release=Release(pods=("dev/x",)))]))
    async with solver(nats_settings, kube_api, kube, kubelet) as running:
        await wait_for(lambda: not running.solver.plans, what="the forged plan handled at start")
        assert refused(running, why) == 1
        namespace, name = victim.split("/")
        assert (await kube.get_pod(namespace, name))["metadata"]["name"] == name  # still there
        assert running.solver.metrics.evictions.labels("owner-back", "evicted")._value.get() == 0


async def test_a_recorded_victim_recreated_under_its_name_is_not_deleted(
    nats_settings: NatsSettings, kube_api: KubeApi, kube: Kube, bridge: FakeBridge, kubelet: Kubelet,
) -> None:
    """The solver took spot/b1 out of the cache (uid u-old) and stopped before evicting it; the
    pod was then deleted and a new spot/b1 created: the resumed plan must not touch the new one."""
    old_uid = await create_pod(kube, "spot/b1", NODE)
    await kube.delete_pod("spot", "b1", grace_seconds=0)
    await create_pod(kube, "spot/b1", NODE)
    kubelet.allocate("spot/b1", "main", "gpushare/spot-gpu", ["spot-GPU-0"])  # the new one holds it too
    async with solver(nats_settings, kube_api, kube, kubelet) as running:
        running.solver.state.evicting["spot/b1"] = Victim(uid=old_uid, devices=("spot-GPU-0",))
        await running.solver.evict("resume-1", "owner-back", {"spot/b1": old_uid})
        assert refused(running, "uid-mismatch") == 1
        assert (await kube.get_pod("spot", "b1"))["metadata"]["uid"] != old_uid
        assert "spot/b1" not in running.solver.state.evicting


async def publish_forged(nats: NatsSettings, event: SpotEvent) -> None:
    """What a compromised detector may publish on its own node's subjects: the node's cards (GPU-0),
    then a SpotEvent naming a card that is not among them (the solver plans a card-gone eviction)."""
    bus = Bus(nats, "test-detector")
    await bus.connect()
    inventory = CardInventory(node=NODE, vendor_resource="nvidia.com/gpu", devices=("GPU-0",))
    await bus.publish_persistent(bus.subjects.event(NODE, "inventory"), inventory)
    await bus.publish_persistent(bus.subjects.event(NODE, "spot"), event)
    await bus.drain()


@pytest.mark.parametrize(("victim", "kubelet_says", "why"), [
    ("kube-system/coredns-7d8f", None, "not-on-this-kubelet"),  # a pod of the node holding no GPU
    ("apps/web", {}, "not-holding-its-devices"),  # listed by the kubelet, holding nothing
    ("spot/b2", {"gpushare/spot-gpu": ["spot-GPU-1"]}, "not-holding-its-devices"),  # another card's
])
async def test_a_forged_spot_event_kills_nothing_the_kubelet_does_not_confirm(
    victim: str, kubelet_says: dict[str, list[str]] | None, why: str, nats_settings: NatsSettings,
    kube_api: KubeApi, kube: Kube, bridge: FakeBridge, kubelet: Kubelet,
) -> None:
    """The detector's identity says ``victim`` uses spot-GPU-9, a card that is not lent: the event
    puts it on record (the ledger) and plans its eviction; the kubelet, asked at the reclaim, does
    not say it holds spot-GPU-9 — refused and counted, never killed nor deleted."""
    await create_pod(kube, victim, NODE)
    for resource, devices in (kubelet_says or {}).items():
        kubelet.allocate(victim, "main", resource, devices)
    if kubelet_says == {}:
        kubelet.admit(victim, "main")
    async with solver(nats_settings, kube_api, kube, kubelet) as running:
        await publish_forged(nats_settings, SpotEvent(node=NODE, pod=victim, container="main", state="using",
                                                      devices=("spot-GPU-9",)))
        await wait_for(lambda: refused(running, why) == 1, what=f"the eviction refused ({why})")
        await wait_for(lambda: not running.solver.plans, what="the plan done")
        namespace, name = victim.split("/")
        assert (await kube.get_pod(namespace, name))["metadata"]["name"] == name  # still there
        assert running.solver.metrics.evictions.labels("card-gone", "evicted")._value.get() == 0


class _ApiDownOnce(Kube):
    """The API server gone for the first read of ``pod``, just after the reclaim's kill began: the
    kill frees the pod's devices, so the kubelet no longer lists them when the reclaim is retried."""

    def __init__(self, kube: Kube, pod: str, kubelet: Kubelet) -> None:
        super().__init__(kube.client.settings)
        self.pod, self.kubelet, self.failed = pod, kubelet, False

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        if f"{namespace}/{name}" == self.pod and not self.failed:
            self.failed = True
            self.kubelet.lister.table[namespace, name] = {"main": {}}  # listed, holding nothing: the kill's doing
            raise Retryable(f"get pod {self.pod}: connection refused")
        return await super().get_pod(namespace, name)


async def test_a_retried_reclaim_kills_what_the_kubelet_confirmed_before_its_own_kill_freed_it(
    nats_settings: NatsSettings, kube_api: KubeApi, kube: Kube, bridge: FakeBridge, kubelet: Kubelet,
) -> None:
    """A pressure eviction: the kubelet confirmed spot/b1 (a gpushare device) and the kill began;
    the API server then failed the pod's read, so the plan is tried again. The retry must not
    refuse the pod because its own kill freed the device: it is evicted (asked again, the kubelet
    would list it holding nothing). The same holds for an owner-back's borrower."""
    uid = await create_pod(kube, "spot/b1", NODE)
    kubelet.allocate("spot/b1", "main", "gpushare/spot-gpu", ["spot-GPU-0"])
    pods = _ApiDownOnce(kube, "spot/b1", kubelet)
    stop = asyncio.Event()
    settings = SolverSettings(ack_wait_s=2.0, retry_first_s=0.05, retry_max_s=0.5,
                              pod_resources_socket=str(kubelet.socket))
    try:
        async with app.Service(common_settings(nats_settings, kube_api.kubeconfig, NODE), settings, stop,
                               pods=pods, tasks_api=FakeTasks()).started() as running:  # fmt: skip
            with contextlib.suppress(Retryable):
                await running.solver.evict("retried-1", PRESSURE, {"spot/b1": uid})
            await wait_for(lambda: not running.solver.plans, what="the retried plan done")
            assert pods.failed, "the read never failed"
            assert refused(running, "holds-no-gpushare-device") == 0
            assert running.solver.metrics.evictions.labels(PRESSURE, "evicted")._value.get() == 1
            with pytest.raises(NotFound):
                await kube.get_pod("spot", "b1")
            stop.set()
    finally:
        await pods.close()
