"""A plan in the solver's bucket is data: the solver verifies every pod before it kills or deletes
it (taken out of the mapping cache by its own handler, on its node, with the recorded uid). A
forged plan is refused and counted, never executed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from gpushare_common.adapters.kube import Kube
from gpushare_common.bus import Bus
from gpushare_common.settings import NatsSettings
from gpushare_solver import app
from gpushare_solver.actions import Plan, Reclaim, Release
from gpushare_solver.reclaim import Seen, refusal
from gpushare_solver.settings import SolverSettings
from gpushare_solver.state import Victim

from tests.solver.conftest import NODE, FakeBridge, wait_for
from tests.solver.fakes import FakeTasks
from tests.solver.world import common_settings
from tests.support.kubeapi import KubeApi


def test_refusal_table() -> None:
    mine = Victim(uid="u1")
    assert refusal(mine, Seen("u1", NODE), NODE) == ""
    assert refusal(mine, None, NODE) == ""  # gone: nothing to do
    assert refusal(None, Seen("u1", NODE), NODE) == "not-taken-out-of-the-cache"
    assert refusal(mine, Seen("u1", "node-b"), NODE) == "on-another-node"
    assert refusal(mine, Seen("u2", NODE), NODE) == "uid-mismatch"  # recreated under the same name
    assert refusal(Victim(), Seen("u9", NODE), NODE) == ""  # no uid recorded: the node decides
    assert refusal(mine, Seen("", "", malformed="spec.priority"), NODE) == "malformed-pod"  # who is it?


async def create_pod(kube: Kube, key: str, node: str) -> str:
    namespace, name = key.split("/")
    body = {"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [
        {"name": "main", "image": "busybox"}]}}
    created = await kube.create_pod(namespace, body)
    return str(created["metadata"]["uid"])


@contextlib.asynccontextmanager
async def solver(nats: NatsSettings, kube_api: KubeApi, kube: Kube) -> AsyncIterator[app.Service]:
    stop = asyncio.Event()
    settings = SolverSettings(ack_wait_s=2.0, retry_first_s=0.05, retry_max_s=0.5)
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
    bridge: FakeBridge,
) -> None:
    await create_pod(kube, victim, node)
    await forge(nats_settings, Plan(trigger_id="forged-1", event="ownerback", actions=[
        Reclaim(reason="owner-back", pods=(victim,), owner="dev/x", release=Release(pods=("dev/x",)))]))
    async with solver(nats_settings, kube_api, kube) as running:
        await wait_for(lambda: not running.solver.plans, what="the forged plan handled at start")
        assert refused(running, why) == 1
        namespace, name = victim.split("/")
        assert (await kube.get_pod(namespace, name))["metadata"]["name"] == name  # still there
        assert running.solver.metrics.evictions.labels("owner-back", "evicted")._value.get() == 0


async def test_a_recorded_victim_recreated_under_its_name_is_not_deleted(
    nats_settings: NatsSettings, kube_api: KubeApi, kube: Kube, bridge: FakeBridge,
) -> None:
    """The solver took spot/b1 out of the cache (uid u-old) and stopped before evicting it; the
    pod was then deleted and a new spot/b1 created: the resumed plan must not touch the new one."""
    old_uid = await create_pod(kube, "spot/b1", NODE)
    await kube.delete_pod("spot", "b1", grace_seconds=0)
    await create_pod(kube, "spot/b1", NODE)
    async with solver(nats_settings, kube_api, kube) as running:
        running.solver.state.evicting["spot/b1"] = Victim(uid=old_uid, devices=("spot-GPU-0",))
        await running.solver.evict("resume-1", "owner-back", {"spot/b1": old_uid})
        assert refused(running, "uid-mismatch") == 1
        assert (await kube.get_pod("spot", "b1"))["metadata"]["uid"] != old_uid
        assert "spot/b1" not in running.solver.state.evicting
