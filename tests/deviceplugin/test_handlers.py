"""Plugin logic called directly: table-driven Allocate and GetPreferredAllocation."""

from __future__ import annotations

import json

import pytest
from gpushare_common import ids
from gpushare_common.pods import MANAGED_BY, SHADOW_CONTROLLER, PodRules
from gpushare_deviceplugin.errors import PluginError
from gpushare_deviceplugin.handlers.base import PreferredRequest, Signer
from gpushare_deviceplugin.handlers.capacity import CapacityLogic
from gpushare_deviceplugin.handlers.share import (
    ShadowPodView,
    ShareLogic,
    gpu_container,
    shadow_view,
)
from gpushare_deviceplugin.handlers.spot import SpotLogic

from .conftest import KEY, NODE

FROM = ids.ANN_DEVICES_FROM + "*"
IDS = ids.ANN_DEVICES_IDS + "*"
SIG_FROM = ids.signature_annotation(ids.KIND_FROM, "*")
SIG_IDS = ids.signature_annotation(ids.KIND_IDS, "*")


def share(policy: str = "packed", spec: int = 4) -> ShareLogic:
    logic = ShareLogic(f"gpushare/share-gpu-{spec}", spec, Signer(KEY, NODE), policy)
    logic.replace_shadows([
        ShadowPodView("ns", "shadow-a", "share", spec),
        ShadowPodView("ns", "shadow-b", "share", spec, container="gpu"),
        ShadowPodView("other", "old-1", "share", spec, terminating=True),
    ])
    return logic


def spot() -> SpotLogic:
    logic = SpotLogic("gpushare/spot-gpu", Signer(KEY, NODE))
    logic.set_vendor_cards("nvidia.com/gpu", {"GPU-0": "Healthy", "GPU-1": "Healthy",
                                              "GPU-2": "Unhealthy", "GPU-3": "Healthy"})
    logic.set_vendor_cards("example.com/npu", {"NPU-0": "Healthy"})
    logic.apply_health({"spot-GPU-0": "Healthy", "spot-GPU-1": "Healthy",
                        "spot-GPU-2": "Healthy", "spot-NPU-0": "Healthy"}, full=True)
    return logic


@pytest.mark.parametrize(("request_ids", "sources"), [
    (["ns/shadow-a-0"], {"ns/shadow-a/main": {"*": ["ns/shadow-a-0"]}}),
    (["ns/shadow-b-3", "ns/shadow-b-1"], {"ns/shadow-b/gpu": {"*": ["ns/shadow-b-3",
                                                                  "ns/shadow-b-1"]}}),
    (["ns/shadow-a-1", "ns/shadow-b-0"], {"ns/shadow-a/main": {"*": ["ns/shadow-a-1"]},
                                          "ns/shadow-b/gpu": {"*": ["ns/shadow-b-0"]}}),
])
def test_share_allocate_returns_signed_devices_from(request_ids: list[str],
                                                    sources: dict[str, object]) -> None:
    [annotations] = share().allocate([request_ids])
    assert set(annotations) == {FROM, SIG_FROM}
    assert json.loads(annotations[FROM]) == sources
    assert ids.verify(KEY, ids.KIND_FROM, NODE, "*", annotations[FROM], annotations[SIG_FROM])
    assert ids.parse_devices_from("*", annotations[FROM]).leaves_pod("tenant", "pod")


@pytest.mark.parametrize(("request_ids", "code"), [
    ([], "invalid-argument"),
    (["ns/shadow-a-0", "ns/shadow-a-0"], "invalid-argument"),
    (["shadow-a-0"], "invalid-argument"),
    (["ns/shadow-a-x"], "invalid-argument"),
    (["ns/shadow-a-4"], "not-found"),
    (["ns/shadow-z-0"], "not-found"),
    (["other/old-1-0"], "failed-precondition"),
    (["spot-GPU-0"], "invalid-argument"),
])
def test_share_allocate_refusals(request_ids: list[str], code: str) -> None:
    with pytest.raises(PluginError) as refused:
        share().allocate([request_ids])
    assert refused.value.code == code


def test_share_allocate_needs_a_container() -> None:
    with pytest.raises(PluginError, match="without container requests"):
        share().allocate([])


def test_share_desired_unhealthy_is_refused() -> None:
    logic = share()
    logic.apply_health({"ns/shadow-a-2": "Unhealthy"}, full=False)
    assert logic.board.health("ns/shadow-a-2") == "Unhealthy"
    with pytest.raises(PluginError) as refused:
        logic.allocate([["ns/shadow-a-2"]])
    assert refused.value.code == "failed-precondition"


A = [f"ns/shadow-a-{i}" for i in range(4)]
B = [f"ns/shadow-b-{i}" for i in range(4)]


@pytest.mark.parametrize(("policy", "available", "must", "size", "expected"), [
    ("packed", [*A[:3], B[0]], [], 1, [B[0]]),            # b has the fewest free
    ("packed", [*A[:3], B[0]], [], 2, [A[0], A[1]]),      # only a can hold both
    ("packed", [A[0], B[0], B[1]], [], 3, [B[0], B[1], A[0]]),
    ("packed", [*A, *B], [A[3]], 2, [A[3], A[0]]),
    ("spread", [*A[:3], B[0]], [], 1, [A[0]]),            # a has the most free
    ("spread", [*A[:2], *B[:2]], [], 2, [A[0], B[0]]),
])
def test_share_preferred(policy: str, available: list[str], must: list[str], size: int,
                         expected: list[str]) -> None:
    request = PreferredRequest(tuple(available), tuple(must), size)
    assert share(policy).preferred([request]) == [expected]


@pytest.mark.parametrize(("available", "must", "size"), [
    (["ns/shadow-a-0"], [], 2),
    (["ns/shadow-a-0"], [], 0),
    (["ns/shadow-a-0", "ns/shadow-a-0"], [], 1),
    (["ns/shadow-a-0"], ["ns/shadow-b-0"], 1),
    (["ns/shadow-a-0", "ns/shadow-a-1"], ["ns/shadow-a-0", "ns/shadow-a-1"], 1),
    (["bogus", "ns/shadow-a-1"], [], 1),
])
def test_share_preferred_refusals(available: list[str], must: list[str], size: int) -> None:
    with pytest.raises(PluginError) as refused:
        share().preferred([PreferredRequest(tuple(available), tuple(must), size)])
    assert refused.value.code == "invalid-argument"


def test_share_devices_per_shadow_pod() -> None:
    devices = share(spec=2).board.devices()
    assert devices == {"ns/shadow-a-0": "Healthy", "ns/shadow-a-1": "Healthy",
                       "ns/shadow-b-0": "Healthy", "ns/shadow-b-1": "Healthy",
                       "other/old-1-0": "Unhealthy", "other/old-1-1": "Unhealthy"}


@pytest.mark.parametrize(("request_ids", "devices"), [
    (["spot-GPU-0"], {"nvidia.com/gpu": ["GPU-0"]}),
    (["spot-GPU-1", "spot-NPU-0"], {"nvidia.com/gpu": ["GPU-1"], "example.com/npu": ["NPU-0"]}),
])
def test_spot_allocate_returns_signed_real_ids(request_ids: list[str],
                                               devices: dict[str, list[str]]) -> None:
    [annotations] = spot().allocate([request_ids])
    assert set(annotations) == {IDS, SIG_IDS}
    assert json.loads(annotations[IDS]) == devices
    assert ids.verify(KEY, ids.KIND_IDS, NODE, "*", annotations[IDS], annotations[SIG_IDS])
    ids.parse_devices_ids("*", annotations[IDS])


@pytest.mark.parametrize(("request_ids", "code"), [
    (["spot-GPU-2"], "failed-precondition"),   # card Unhealthy at the vendor
    (["spot-GPU-3"], "failed-precondition"),   # solver never said Healthy
    (["spot-GPU-7"], "not-found"),
    (["GPU-0"], "invalid-argument"),
    (["spot-"], "invalid-argument"),
    (["spot-GPU-0", "spot-GPU-2"], "failed-precondition"),
    ([], "invalid-argument"),
])
def test_spot_allocate_refusals(request_ids: list[str], code: str) -> None:
    with pytest.raises(PluginError) as refused:
        spot().allocate([request_ids])
    assert refused.value.code == code


def test_spot_card_gone_turns_unhealthy_and_back() -> None:
    logic = spot()
    logic.set_vendor_cards("nvidia.com/gpu", {"GPU-1": "Healthy"})
    assert logic.board.health("spot-GPU-0") == "Unhealthy"
    logic.set_vendor_cards("nvidia.com/gpu", None)
    assert logic.board.health("spot-GPU-1") == "Unhealthy"
    assert logic.board.health("spot-NPU-0") == "Healthy"
    logic.set_vendor_cards("nvidia.com/gpu", {"GPU-0": "Healthy"})
    assert logic.board.health("spot-GPU-0") == "Healthy"


@pytest.mark.parametrize(("borrowed", "available", "size", "expected"), [
    ((), ["spot-GPU-1", "spot-GPU-0"], 1, ["spot-GPU-0"]),
    (("spot-GPU-0",), ["spot-GPU-0", "spot-GPU-1"], 1, ["spot-GPU-1"]),
    (("spot-GPU-0",), ["spot-GPU-0", "spot-GPU-1", "spot-NPU-0"], 3,
     ["spot-GPU-1", "spot-NPU-0", "spot-GPU-0"]),
    ((), ["spot-GPU-3", "spot-GPU-1"], 1, ["spot-GPU-1"]),
])
def test_spot_preferred_idle_first(borrowed: tuple[str, ...], available: list[str], size: int,
                                   expected: list[str]) -> None:
    logic = spot()
    logic.set_borrowed("batch/job/main", borrowed)
    assert logic.preferred([PreferredRequest(tuple(available), (), size)]) == [expected]


def test_capacity_devices_and_allocate() -> None:
    logic = CapacityLogic("gpushare/vmem", "vmem")
    logic.set_capacity(3, 1 << 20)
    assert logic.board.devices() == {"vmem-0": "Healthy", "vmem-1": "Healthy",
                                     "vmem-2": "Healthy"}
    assert logic.allocate([["vmem-1"], ["vmem-0", "vmem-2"]]) == [{}, {}]
    with pytest.raises(PluginError):
        logic.allocate([["vmem-3"]])
    logic.set_capacity(0, 1 << 20)
    assert logic.board.devices() == {}


SYSTEM = "gpushare-system"
RULES = PodRules()
OURS = {ids.LABEL_POD_DESCRIPTION: ids.SHADOW_POD_LABEL_VALUE, MANAGED_BY: SHADOW_CONTROLLER}


def pod(phase: str = "Running", namespace: str = SYSTEM, labels: dict[str, str] | None = None,
        **notes: str) -> dict[str, object]:
    return {
        "metadata": {"namespace": namespace, "name": "shadow-a", "labels": OURS if labels is None else labels,
                     "annotations": notes},
        "spec": {"containers": [{"name": "main"}]},
        "status": {"phase": phase},
    }


@pytest.mark.parametrize(("doc", "view"), [
    (pod(**{ids.ANN_SHARE_SPEC: "4"}), ShadowPodView(SYSTEM, "shadow-a", "share", 4)),
    (pod(**{ids.ANN_SHARE_SPEC: "8", ids.ANN_SHARE_KIND: "share-dev"}),
     ShadowPodView(SYSTEM, "shadow-a", "share-dev", 8)),
    (pod("Pending", **{ids.ANN_SHARE_SPEC: "4"}), None),
    (pod(**{ids.ANN_SHARE_SPEC: "four"}), None),
    (pod(), None),
    # the label in a tenant's namespace, or without the shadow-controller's: not a ShadowPod
    (pod(namespace="mallory", **{ids.ANN_SHARE_SPEC: "4"}), None),
    (pod(labels={ids.LABEL_POD_DESCRIPTION: ids.SHADOW_POD_LABEL_VALUE}, **{ids.ANN_SHARE_SPEC: "4"}), None),
    ({"metadata": {"name": "x"}}, None),
    ({}, None),
])
def test_shadow_view(doc: dict[str, object], view: ShadowPodView | None) -> None:
    assert shadow_view(doc, RULES) == view


@pytest.mark.parametrize(("containers", "name"), [
    ([{"name": "main"}], "main"),
    ([{"name": "sidecar"}, {"name": "main"}], "main"),
    ([{"name": "sidecar", "resources": {"limits": {"cpu": "1"}}},
      {"name": "holder", "resources": {"limits": {"nvidia.com/gpu": "1"}}}], "holder"),
    ([{"name": "only"}], "only"),
    ([], "main"),
])
def test_gpu_container(containers: list[dict[str, object]], name: str) -> None:
    assert gpu_container(containers) == name  # type: ignore[arg-type]
