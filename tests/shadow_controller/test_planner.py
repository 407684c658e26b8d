"""Reconcile decisions as tables: demand, supply, idle retirement."""

from __future__ import annotations

import pytest
from gpushare_common.mapping import QuotaKey
from gpushare_common.pods import PodRules
from gpushare_shadow_controller.model import ShadowPod, SharePod, classify
from gpushare_shadow_controller.placement import ANYWHERE, Placement
from gpushare_shadow_controller.planner import plan

Q4 = QuotaKey("ml", "share", 4)
Q1 = QuotaKey("ml", "share", 1)


def pending(i: int, quota: QuotaKey = Q4, count: int = 1) -> SharePod:
    return SharePod(f"ml/p{i}", quota, count, "", pending=True, active=False, owner="")


def bound(i: int, owner: str, quota: QuotaKey = Q4, node: str = "n1") -> SharePod:
    return SharePod(f"ml/b{i}", quota, 1, node, pending=False, active=True, owner=owner)


def shadow(name: str, phase: str = "Running", quota: QuotaKey = Q4, terminating: bool = False,
           node: str = "n1", using: int = 0) -> ShadowPod:
    return ShadowPod(f"ml/{name}", name, quota, node if phase == "Running" else "", phase,
                     terminating, "", using)


@pytest.mark.parametrize(("records", "expected", "creates"), [
    ([pending(i) for i in range(5)], {}, 2),
    ([pending(i) for i in range(4)], {}, 1),
    ([pending(i) for i in range(8)], {}, 2),
    ([pending(0, Q1), pending(1, Q1)], {}, 2),                         # N = 1
    ([pending(i) for i in range(5)] + [shadow("s1", "Pending")], {}, 1),  # Pending counts as supply
    ([pending(i) for i in range(5)], {"ml/new": (Q4, ANYWHERE)}, 1),               # created, not yet seen
    ([pending(i) for i in range(4)] + [shadow("s1", terminating=True)], {}, 1),  # terminating: no supply
    ([pending(0), shadow("s1"), bound(1, "ml/s1"), bound(2, "ml/s1"), bound(3, "ml/s1")], {}, 0),
    ([pending(0), pending(1), shadow("s1"), bound(1, "ml/s1"), bound(2, "ml/s1"), bound(3, "ml/s1")],
     {}, 1),
    ([pending(0), shadow("s1", using=4)], {}, 1),                      # Using conditions count too
    ([pending(0), shadow("s1"), bound(1, ""), bound(2, ""), bound(3, ""), bound(4, "")], {}, 1),
    # Using conditions written, owner annotations not yet: the four users are counted once
    ([shadow("s1", using=4), bound(1, ""), bound(2, ""), bound(3, ""), bound(4, "")], {}, 0),
    ([shadow("s1", using=2), bound(1, ""), bound(2, ""), bound(3, "ml/s1")], {}, 0),
    ([pending(0), shadow("s1", using=3), bound(1, ""), bound(2, ""), bound(3, "")], {}, 0),
    ([], {}, 0),
])
def test_creations(records: list, expected: dict, creates: int) -> None:  # type: ignore[type-arg]
    result = plan(records, expected, {}, now=0.0, idle_timeout_s=60)
    assert sum(c.count for c in result.creates) == creates


def test_counts_per_quota_key() -> None:
    result = plan([pending(0), pending(1), shadow("s1"), bound(1, "ml/s1"), shadow("s2", terminating=True)],
                  {}, {}, 0.0, 60)
    count = result.counts[Q4]
    assert (count.pipelining, count.ready, count.releasing) == (-2, 3, 4)


def test_idle_shadowpod_retired_after_timeout_not_before() -> None:
    idle: dict[str, float] = {}
    records = [shadow("s1")]
    assert plan(records, {}, idle, now=100.0, idle_timeout_s=60).deletes == []
    assert plan(records, {}, idle, now=159.0, idle_timeout_s=60).deletes == []
    (delete,) = plan(records, {}, idle, now=160.0, idle_timeout_s=60).deletes
    assert delete.shadow == "ml/s1"


def test_shadowpod_with_users_never_retired_and_timer_resets() -> None:
    idle: dict[str, float] = {}
    plan([shadow("s1")], {}, idle, 0.0, 60)
    assert plan([shadow("s1"), bound(1, "ml/s1")], {}, idle, 1000.0, 60).deletes == []
    assert "ml/s1" not in idle
    assert plan([shadow("s1")], {}, idle, 1030.0, 60).deletes == []
    assert plan([shadow("s1", using=1)], {}, idle, 5000.0, 60).deletes == []


def test_unattributed_sharepod_on_node_protects_shadowpods_there() -> None:
    idle: dict[str, float] = {"ml/s1": 0.0}
    assert plan([shadow("s1"), bound(1, "")], {}, idle, 1000.0, 60).deletes == []


def test_idle_shadowpod_kept_while_demand_pending() -> None:
    idle = {"ml/s1": 0.0}
    assert plan([shadow("s1", using=4), pending(0)], {}, idle, 1000.0, 60).deletes == []


def _pod(resources: dict[str, str], namespace: str = "ml", **meta: object) -> dict[str, object]:
    return {"metadata": {"namespace": namespace, "name": "x", **meta},
            "spec": {"containers": [{"name": "c", "resources": {"requests": resources}}]},
            "status": {"phase": "Pending"}}


SHADOW_LABELS = {"gpushare.k8s.io/pod-description": "shadow-pod",
                 "app.kubernetes.io/managed-by": "gpushare-shadow-controller"}
SPEC4 = {"gpushare.k8s.io/share-kind": "share", "gpushare.k8s.io/share-spec": "4"}


def test_classification() -> None:
    rules = PodRules()
    share = classify(_pod({"gpushare/share-dev-gpu-8": "1"}), rules)
    assert isinstance(share, SharePod) and share.quota == QuotaKey("gpushare-system", "share-dev", 8)
    assert share.pending and share.count == 1
    assert classify(_pod({"nvidia.com/gpu": "1"}), rules) is None
    assert classify(_pod({"gpushare/share-gpu-0": "1"}), rules) is None
    shadow_pod = classify(_pod({"nvidia.com/gpu": "1"}, "gpushare-system", labels=SHADOW_LABELS,
                               annotations=SPEC4), rules)  # fmt: skip
    assert isinstance(shadow_pod, ShadowPod) and shadow_pod.quota == QuotaKey("gpushare-system", "share", 4)
    assert classify(_pod({"nvidia.com/gpu": "1"}, "ml", labels=SHADOW_LABELS, annotations=SPEC4), rules) is None
    broken = classify(_pod({}, "gpushare-system", labels=SHADOW_LABELS,
                           annotations={"gpushare.k8s.io/share-spec": "four"}), rules)  # fmt: skip
    assert broken is None


# --- placement: a SharePod that names its node is served only by a ShadowPod there ---

ON_N2 = Placement.of({"kubernetes.io/hostname": "n2"}, {})
GPU_NODES = Placement.of({"pool": "a100"}, {})


def placed(i: int, placement: Placement, quota: QuotaKey = Q4) -> SharePod:
    return SharePod(f"ml/p{i}", quota, 1, "", pending=True, active=False, owner="", placement=placement)


def test_a_sharepod_pinned_elsewhere_gets_a_shadowpod_on_its_node() -> None:
    """A free ShadowPod on n1 is no supply for a SharePod that may run on n2 only: a ShadowPod is
    made for its placement (before, it waited while the one on n1 idled)."""
    (create,) = plan([placed(0, ON_N2), shadow("s1", node="n1")], {}, {}, 0.0, 60).creates
    assert (create.count, create.placement) == (1, ON_N2)
    assert "pending on n2, 0 free" in create.reason


def test_a_shadowpod_serves_a_placement_it_was_made_for_or_the_node_it_runs_on() -> None:
    on_n2 = ShadowPod("ml/s2", "s2", Q4, "n2", "Running", False, "", 0)
    assert plan([placed(0, ON_N2), on_n2], {}, {}, 0.0, 60).creates == []
    made_for = ShadowPod("ml/s3", "s3", Q4, "", "Pending", False, "", 0, placement=GPU_NODES)
    assert plan([placed(0, GPU_NODES), made_for], {}, {}, 0.0, 60).creates == []
    assert plan([placed(0, GPU_NODES)], {"ml/new": (Q4, GPU_NODES)}, {}, 0.0, 60).creates == []
    # a label selector the controller cannot check against a node: only a ShadowPod made for it serves
    assert sum(c.count for c in plan([placed(0, GPU_NODES), on_n2], {}, {}, 0.0, 60).creates) == 1
    # a SharePod that asks for no node takes any ShadowPod's devices
    assert plan([pending(0), made_for], {}, {}, 0.0, 60).creates == []


def test_an_idle_shadowpod_no_pending_sharepod_can_use_is_retired() -> None:
    idle = {"ml/s1": 0.0}
    (delete,) = plan([placed(0, ON_N2), shadow("s1", node="n1")], {}, idle, 1000.0, 60).deletes
    assert delete.shadow == "ml/s1"
    assert plan([placed(0, ON_N2), shadow("s1", node="n2")], {}, {"ml/s1": 0.0}, 1000.0, 60).deletes == []


def test_counts_per_quota_key_add_up_every_placement() -> None:
    result = plan([placed(0, ON_N2), pending(1), shadow("s1", node="n1")], {}, {}, 0.0, 60)
    count = result.counts[Q4]
    assert (count.pipelining, count.ready) == (-2, 4)
    assert [(c.count, c.placement) for c in result.creates] == [(1, ON_N2)]


def test_classification_reads_placements() -> None:
    rules = PodRules()
    body = _pod({"gpushare/share-gpu-4": "1"})
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "n2"}  # type: ignore[index]
    share = classify(body, rules)
    assert isinstance(share, SharePod) and share.placement == ON_N2 and share.placement.hostname == "n2"
    made = classify(_pod({"nvidia.com/gpu": "1"}, "gpushare-system", labels=SHADOW_LABELS,
                         annotations={**SPEC4, "gpushare.k8s.io/placement": ON_N2.text}), rules)  # fmt: skip
    assert isinstance(made, ShadowPod) and made.placement == ON_N2
    odd = classify(_pod({"nvidia.com/gpu": "1"}, "gpushare-system", labels=SHADOW_LABELS,
                        annotations={**SPEC4, "gpushare.k8s.io/placement": "{not json"}), rules)  # fmt: skip
    assert isinstance(odd, ShadowPod) and odd.placement == ANYWHERE
