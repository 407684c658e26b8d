"""Evictions told in Kubernetes' terms: the DisruptionTarget condition set before the deletion,
an Event per cause, Warning Events for refused and failed evictions (the solver wired in memory
against a real nats-server; the reasons and messages as pure functions)."""

from __future__ import annotations

import pytest
from gpushare_common.adapters.kube import Obj
from gpushare_common.events import OwnerBackEvent
from gpushare_common.settings import NatsSettings
from gpushare_solver import disruption
from gpushare_solver.cards import CARD_GONE, RESERVED_REASON
from gpushare_solver.pressure import PRESSURE
from gpushare_solver.share import SHADOW_GONE
from gpushare_solver.spot import OWNER_BACK

from tests.solver.conftest import NODE, FakeBridge, wait_for
from tests.solver.fakes import FakePods
from tests.solver.jobpolicy import IGNORE_DISRUPTIONS, matched_action
from tests.solver.test_service import (
    OWNER,
    SPOT,
    eviction_recorder,
    lend_to_borrower,
    owner_and_borrower,
    publish_all,
    wired,
)


@pytest.mark.parametrize(("cause", "reason", "says"), [
    (OWNER_BACK, "OwnerReturned", "the owner dev/alice of the card GPU-0 came back"),
    (SHADOW_GONE, "ShadowPodGone", "its ShadowPod dev/alice, holding the card GPU-0, is gone"),
    (RESERVED_REASON, "CardReserved", "the card GPU-0 is now held by dev/alice"),
    (CARD_GONE, "CardGone", "the card GPU-0 is no longer on the node"),
    ("from-a-newer-solver", "EvictedByGpushare", "from-a-newer-solver (owner dev/alice, card GPU-0)"),
])
def test_each_cause_has_its_reason_and_names_owner_card_and_node(cause: str, reason: str, says: str) -> None:
    told = disruption.explain(cause, OWNER, ("GPU-0",), NODE)
    assert told == disruption.Explanation(reason, f"gpushare evicted this pod from node {NODE}: {says}")
    assert told.reason in disruption.REASONS


@pytest.mark.parametrize(("over", "reason", "short"), [
    (("memory",), "MemoryPressure", "memory"), (("cpu",), "CPUPressure", "CPU"),
    (("cpu", "memory"), "MemoryPressure", "memory and CPU")])
def test_pressure_names_the_resource_short(over: tuple[str, ...], reason: str, short: str) -> None:
    told = disruption.explain(PRESSURE, "", (), NODE, over)
    says = f"gpushare evicted this oversold pod: node {NODE} is short of {short}"
    assert (told.reason, told.message) == (reason, says)
    assert told.reason in disruption.REASONS


def test_a_victims_cards_come_from_its_spot_devices_unless_known() -> None:
    assert disruption.cards_of(("spot-GPU-0", "team/shadow-1")) == ("GPU-0",)
    assert disruption.cards_of(("team/shadow-1",), ("GPU-3",)) == ("GPU-3",)


class ReleaseWatch(FakePods):
    """FakePods noting, at each status patch, how many releases the kmod-bridge had received."""

    def __init__(self, bridge: FakeBridge) -> None:
        super().__init__()
        self.bridge = bridge
        self.releases_at_patch: list[int] = []

    async def patch_pod_status(self, namespace: str, name: str, patch: Obj, strategic: bool = True) -> Obj:
        self.releases_at_patch.append(len(self.bridge.ops("release")))
        return await super().patch_pod_status(namespace, name, patch, strategic)


async def test_the_condition_is_set_after_the_release_and_before_the_deletion(
    nats_settings: NatsSettings, bridge: FakeBridge,
) -> None:
    """An owner back: the borrower's DisruptionTarget condition is written once the owner is
    released (the owner never waits for it) and before the pod is deleted; a Job's rule
    ``onPodConditions: [{type: DisruptionTarget}]`` with action Ignore matches the pod as it was
    deleted; a Normal Event says who came back for which card on which node."""
    _, tasks = owner_and_borrower()
    pods = ReleaseWatch(bridge)
    pods.add(OWNER, NODE, ["owner-c"])
    pods.add("spot/b1", NODE, ["b1-c"], {SPOT: ("spot-GPU-0",)})
    bus, records = await eviction_recorder(nats_settings)
    try:
        async with wired(nats_settings, pods, tasks) as running:
            await lend_to_borrower(bus, running)
            await publish_all(bus, [OwnerBackEvent(node=NODE, pidns=5, pid=1, kernel_ts_ns=1, pod=OWNER)])
            await wait_for(lambda: len(records) == 1 and not running.solver.plans, what="the eviction done")
        assert pods.calls == ["status spot/b1", "event spot/b1", "delete spot/b1"]
        assert pods.releases_at_patch == [1]
        (condition,) = pods.gone["spot/b1"]["status"]["conditions"]
        assert (condition["type"], condition["status"], condition["reason"]) == ("DisruptionTarget", "True",
                                                                                 "OwnerReturned")
        assert matched_action(IGNORE_DISRUPTIONS, pods.gone["spot/b1"]) == "Ignore"
        (event,) = pods.events
        assert (event["type"], event["reason"], event["involvedObject"]["uid"]) == ("Normal", "OwnerReturned", "uid-b1")
        assert all(word in event["message"] for word in (OWNER, "GPU-0", NODE))
        assert event["source"] == {"component": "gpushare-solver", "host": NODE}
    finally:
        await bus.drain()


def test_the_job_rule_needs_the_condition() -> None:
    """The evaluator can fail: a pod killed without the condition counts (exit 137), one that
    exited 42 fails the Job whatever its conditions."""
    killed = {"status": {"containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": 137}}}]}}
    assert matched_action(IGNORE_DISRUPTIONS, killed) is None
    bug = {"status": {"conditions": [{"type": "DisruptionTarget", "status": "True"}],
                      "containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": 42}}}]}}
    assert matched_action(IGNORE_DISRUPTIONS, bug) == "FailJob"
    cleared = {"status": {"conditions": [{"type": "DisruptionTarget", "status": "False"}]}}
    assert matched_action(IGNORE_DISRUPTIONS, cleared) is None


async def test_a_refused_eviction_gets_a_warning_event_and_nothing_else(
    nats_settings: NatsSettings, bridge: FakeBridge,
) -> None:
    """A borrower that now runs on another node is refused: never patched nor deleted, and a
    Warning Event says why."""
    pods, tasks = owner_and_borrower()
    bus, records = await eviction_recorder(nats_settings)
    try:
        async with wired(nats_settings, pods, tasks) as running:
            await lend_to_borrower(bus, running)
            pods.pods["spot/b1"]["spec"]["nodeName"] = "node-b"
            await publish_all(bus, [OwnerBackEvent(node=NODE, pidns=5, pid=1, kernel_ts_ns=1, pod=OWNER)])
            await wait_for(lambda: not running.solver.plans and bool(pods.events), what="the reclaim done")
        assert pods.calls == ["event spot/b1"] and records == []
        (event,) = pods.events
        assert (event["type"], event["reason"]) == ("Warning", "EvictionRefused")
        assert "on-another-node" in event["message"] and NODE in event["message"]
    finally:
        await bus.drain()


async def test_a_failing_kill_is_warned_once_then_the_eviction_told(
    nats_settings: NatsSettings, bridge: FakeBridge,
) -> None:
    """containerd refuses the kill three times: one Warning Event (not one per retry), then, once
    the kill succeeds, the condition and the Normal Event."""
    pods, tasks = owner_and_borrower()
    bus, records = await eviction_recorder(nats_settings)
    try:
        async with wired(nats_settings, pods, tasks) as running:
            await lend_to_borrower(bus, running)
            tasks.failures = 3
            await publish_all(bus, [OwnerBackEvent(node=NODE, pidns=5, pid=1, kernel_ts_ns=1, pod=OWNER)])
            await wait_for(lambda: len(records) == 1 and not running.solver.plans, what="the eviction after retries")
        assert tasks.calls >= 4
        assert [(e["type"], e["reason"]) for e in pods.events] == [("Warning", "EvictionFailed"),
                                                                    ("Normal", "OwnerReturned")]
        assert pods.calls[-3:] == ["status spot/b1", "event spot/b1", "delete spot/b1"]
    finally:
        await bus.drain()
