"""Handler level: from MPS ShadowPod and SharePod records to what each SharePod is told (pure),
and the controller writing it once."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from gpushare_common import ids
from gpushare_common.adapters.kube import KubeError, PodChange
from gpushare_common.mapping import QuotaKey
from gpushare_common.pods import PodRules
from gpushare_shadow_controller.caps import DOWN, RESTARTED, UP, CapsReport, plan_caps
from gpushare_shadow_controller.controller import Controller
from gpushare_shadow_controller.model import Record, ShadowPod, SharePod, classify
from gpushare_shadow_controller.settings import ShadowSettings
from prometheus_client import CollectorRegistry

from tests.detector import podfactory as pf

QUOTA = QuotaKey("gpushare-system", "share", 4)
SHADOW = ShadowPod("gpushare-system/sh-1", "sh-1", QUOTA, "node-1", "Running", False, "", 2,
                   isolation="mps", ready=True, restarts=0, card="nvidia.com/gpu")


def user(name: str, owner: str = SHADOW.key, **kw: Any) -> SharePod:
    fields: dict[str, Any] = {"pending": False, "active": True, "owner": owner, "uid": f"uid-{name}"}
    return SharePod(f"ml/{name}", QUOTA, 1, "node-1", **{**fields, **kw})


def told(reports: list[CapsReport]) -> list[tuple[str, bool, str]]:
    return [(r.pod, r.enforced, r.reason) for r in reports]


def test_a_ready_daemon_tells_nobody_anything() -> None:
    result = plan_caps([SHADOW, user("a"), user("b", caps="True")], {}, {})
    assert (result.reports, result.down, result.not_enforced) == ([], [], [])
    assert result.restarts == {SHADOW.key: 0}


def test_a_daemon_down_is_told_to_every_sharepod_using_the_shadowpod() -> None:
    down = replace(SHADOW, ready=False, users=("ml/by-using",))
    records: list[Record] = [
        down, user("a"), user("by-using", owner=""),  # attributed by the Using condition only
        user("elsewhere", owner="gpushare-system/sh-2"), user("done", active=False),
        user("opted-out", opted_out=True), user("told", caps="False"),
    ]
    result = plan_caps(records, {}, {})
    assert told(result.reports) == [("ml/a", False, DOWN), ("ml/by-using", False, DOWN)]
    report = result.reports[0]
    assert report.warning and report.event_reason == "CapsNotEnforced" and report.transition
    assert report.uid == "uid-a" and report.shadow == SHADOW.key
    assert "ShadowPod gpushare-system/sh-1 (nvidia.com/gpu on node node-1) is down" in report.message
    assert result.down == [SHADOW.key]
    assert result.not_enforced == ["ml/a", "ml/by-using", "ml/told"]


def test_what_was_written_wins_over_a_watch_that_lags() -> None:
    down = replace(SHADOW, ready=False)
    assert plan_caps([down, user("a")], {"ml/a": "False"}, {}).reports == []
    (report,) = plan_caps([SHADOW, user("a")], {"ml/a": "False"}, {}).reports
    assert (report.enforced, report.reason) == (True, UP)


def test_ready_again_sets_the_condition_back_with_a_normal_event() -> None:
    (report,) = plan_caps([SHADOW, user("a", caps="False")], {}, {}).reports
    assert (report.pod, report.enforced, report.reason, report.transition) == ("ml/a", True, UP, True)
    assert not report.warning and report.event_reason == "CapsEnforced"
    assert "is up again" in report.message


@pytest.mark.parametrize("shadow", [
    replace(SHADOW, ready=False, isolation=""),  # a soft share has no daemon
    replace(SHADOW, ready=False, isolation="sim_caps"),  # a profile without a daemon
    replace(SHADOW, ready=False, phase="Pending"),  # starting: its users cannot hold its devices yet
    replace(SHADOW, ready=False, terminating=True),  # going: its users are evicted with it
])
def test_only_a_running_mps_shadowpod_that_is_not_ready_counts(shadow: ShadowPod) -> None:
    result = plan_caps([shadow, user("a"), user("b", caps="False")], {}, {})
    assert result.reports == [] and result.down == []


def test_a_restart_seen_only_by_its_count_is_told_once() -> None:
    first = plan_caps([replace(SHADOW, restarts=2), user("a")], {}, {})
    assert first.reports == [] and first.restarts == {SHADOW.key: 2}  # first sight: the baseline
    again = plan_caps([replace(SHADOW, restarts=3), user("a"), user("b", caps="True")], {}, first.restarts)
    assert told(again.reports) == [("ml/a", True, RESTARTED), ("ml/b", True, RESTARTED)]
    assert [r.transition for r in again.reports] == [True, False]
    assert again.reports[0].warning and "restarted (3 restarts)" in again.reports[0].message
    assert plan_caps([replace(SHADOW, restarts=3), user("a")], {}, again.restarts).reports == []


def test_a_restart_seen_while_down_is_one_warning_and_one_recovery() -> None:
    (down,) = plan_caps([replace(SHADOW, ready=False, restarts=1), user("a")], {}, {SHADOW.key: 0}).reports
    assert (down.reason, down.enforced) == (DOWN, False) and "main restarted (1 restarts)" in down.message
    (up,) = plan_caps([replace(SHADOW, restarts=1), user("a", caps="False")], {}, {SHADOW.key: 1}).reports
    assert up.reason == UP
    # the count rose and the pod was told it was down: the recovery says it, no second warning
    (up,) = plan_caps([replace(SHADOW, restarts=2), user("a", caps="False")], {}, {SHADOW.key: 1}).reports
    assert (up.reason, up.warning) == (UP, False)


def test_a_flapping_daemon_tells_each_sharepod_once_per_change() -> None:
    shares = {"ml/a": user("a"), "ml/b": user("b")}
    seen: dict[str, int] = {}
    history: list[tuple[str, bool, str]] = []
    for ready in (True, False, False, True, True, False, True):
        result = plan_caps([replace(SHADOW, ready=ready), *shares.values()], {}, seen)
        seen = result.restarts
        history += told(result.reports)
        for report in result.reports:  # the watch shows what was written
            shares[report.pod] = replace(shares[report.pod], caps="True" if report.enforced else "False")
    assert history == [("ml/a", False, DOWN), ("ml/b", False, DOWN), ("ml/a", True, UP), ("ml/b", True, UP),
                       ("ml/a", False, DOWN), ("ml/b", False, DOWN), ("ml/a", True, UP), ("ml/b", True, UP)]


def test_records_from_pods_carry_what_the_caps_need() -> None:
    rules = PodRules()
    shadow = pf.shadow("sh-1", node="node-1")
    shadow["metadata"]["annotations"][ids.ANN_ISOLATION] = "mps"
    shadow["status"] = {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "False"},
        {"type": ids.CONDITION_USING, "status": "True", "message": '{"gpushare-system/sh-1-0": "ml/a"}'}],
        "containerStatuses": [{"name": "main", "restartCount": 4}]}
    record = classify(shadow, rules)
    assert isinstance(record, ShadowPod)
    assert (record.isolation, record.ready, record.restarts, record.card, record.users) == (
        "mps", False, 4, "nvidia.com/gpu", ("ml/a",))
    share = pf.share("a", namespace="ml", annotations={ids.ANN_DEVICE_OWNER: record.key})
    share["status"]["conditions"] = [{"type": ids.CONDITION_CAPS_ENFORCED, "status": "False"}]
    share_record = classify(share, rules)
    assert isinstance(share_record, SharePod)
    assert (share_record.uid, share_record.caps, share_record.opted_out) == ("uid-ml-a", "False", False)
    share["metadata"]["annotations"][ids.ANN_ISOLATION] = "none"
    opted = classify(share, rules)
    assert isinstance(opted, SharePod) and opted.opted_out
    soft = classify(pf.shadow("sh-2"), rules)
    assert isinstance(soft, ShadowPod) and (soft.isolation, soft.users) == ("", ())


class FakeKube:
    """Records the controller's writes; ``fail`` makes status patches fail."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, str, dict[str, Any]]] = []
        self.events: list[dict[str, Any]] = []
        self.fail = False

    async def patch_pod_status(self, namespace: str, name: str, patch: dict[str, Any], strategic: bool = True) -> None:
        if self.fail:
            raise KubeError("patch pod status: 500 boom", 500)
        assert strategic  # a strategic merge keeps the pod's other conditions
        self.patches.append((namespace, name, patch))

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        self.events.append(body)


def shadow_doc(ready: bool) -> dict[str, Any]:
    pod = pf.shadow("sh-1", node="node-1")
    pod["metadata"]["annotations"][ids.ANN_ISOLATION] = "mps"
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}]}
    return pod


async def test_the_controller_tells_once_while_the_watch_lags_and_retries_a_failed_write() -> None:
    kube, now, registry = FakeKube(), [1000.0], CollectorRegistry()
    controller = Controller(kube, ShadowSettings(expected_ttl_s=60), registry,  # type: ignore[arg-type]
                            lambda: True, clock=lambda: now[0])
    share = pf.share("a", namespace="ml", annotations={ids.ANN_DEVICE_OWNER: "gpushare-system/sh-1"})
    controller.apply(PodChange("SYNC", pods=[shadow_doc(ready=False), share]))
    kube.fail = True
    await controller.reconcile()
    assert (kube.patches, kube.events) == ([], [])  # no Event without its condition
    assert registry.get_sample_value("gpushare_shadow_write_errors_total") == 1
    kube.fail = False
    await controller.reconcile()
    await controller.reconcile()  # the watch has not shown the condition yet: nothing again
    ((namespace, name, patch),) = kube.patches
    (condition,) = patch["status"]["conditions"]
    assert (namespace, name, condition["type"], condition["status"], condition["reason"]) == (
        "ml", "a", ids.CONDITION_CAPS_ENFORCED, "False", DOWN)
    (event,) = kube.events
    assert (event["type"], event["reason"], event["involvedObject"]["name"], event["related"]["name"]) == (
        "Warning", "CapsNotEnforced", "a", "sh-1")
    assert event["metadata"]["namespace"] == "ml" and event["involvedObject"]["uid"] == "uid-ml-a"
    now[0] += 61  # the watch never showed it (someone else wrote the conditions): told again
    await controller.reconcile()
    assert len(kube.patches) == 2 and len(kube.events) == 2
    share["status"]["conditions"] = [condition]  # the watch shows it now
    controller.apply(PodChange("MODIFIED", pod=share))
    now[0] += 61
    await controller.reconcile()
    assert len(kube.patches) == 2 and controller.caps_told == {}
    assert controller.status()["caps"] == {"mps_daemons_down": ["gpushare-system/sh-1"], "not_enforced": ["ml/a"]}


def test_a_sharepod_a_dra_node_serves_draws_on_no_shadowpod() -> None:
    """The scheduler gave its share-gpu-N a DRA claim (KEP-5004): no ShadowPod device is its, and
    counting it as unattributed demand would keep creating ShadowPods nobody uses."""
    share = pf.share("a", namespace="ml")
    assert isinstance(classify(share, PodRules()), SharePod)
    mapping = {"containerName": "main", "resourceName": "gpushare/share-gpu-4", "requestName": "container-0-request-0"}
    share["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": "a-extended-resources-x1",
                                                      "requestMappings": [mapping]}
    assert classify(share, PodRules()) is None
