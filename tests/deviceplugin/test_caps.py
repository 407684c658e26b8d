"""The share plugins sign the caps of shares of capped ShadowPods (issue 19)."""

from __future__ import annotations

from typing import Any

import pytest
from gpushare_common import ids
from gpushare_common.isolation import ShareCaps, parse_share_caps
from gpushare_common.pods import PodRules
from gpushare_common.settings import SettingsError, load
from gpushare_deviceplugin.errors import PluginError
from gpushare_deviceplugin.handlers.base import Signer
from gpushare_deviceplugin.handlers.share import ShadowPodView, ShareLogic, shadow_view
from gpushare_deviceplugin.plugins.manager import PluginSet, build_logics
from gpushare_deviceplugin.plugins.metrics import PluginMetrics
from gpushare_deviceplugin.settings import PREFIX, DevicePluginSettings
from prometheus_client import CollectorRegistry

from .conftest import KEY, NODE

FROM, ISOLATION = ids.ANN_DEVICES_FROM + "*", ids.ANN_DEVICES_ISOLATION + "*"
SIG_FROM = ids.signature_annotation(ids.KIND_FROM, "*")
SIG_ISOLATION = ids.signature_annotation(ids.KIND_ISOLATION, "*")


def capped(spec: int = 4, memory: dict[str, int] | None = None, opt_out: bool = False) -> ShareLogic:
    logic = ShareLogic(f"gpushare/share-gpu-{spec}", spec, Signer(KEY, NODE),
                       card_memory_mib={"nvidia.com/gpu": 81920} if memory is None else memory,
                       opt_out=opt_out)
    logic.replace_shadows([
        ShadowPodView("gpushare-system", "mps-a", "share", spec, vendor_resource="nvidia.com/gpu",
                      isolation="mps"),
        ShadowPodView("gpushare-system", "soft-b", "share", spec, vendor_resource="nvidia.com/gpu"),
        ShadowPodView("gpushare-system", "bare-c", "share", spec, isolation="mps"),
    ])
    return logic


@pytest.mark.parametrize("spec", range(2, 17))
def test_allocate_signs_the_caps_of_a_capped_share(spec: int) -> None:
    held = [f"gpushare-system/mps-a-{i}" for i in range(0, spec, 2)]
    [annotations] = capped(spec).allocate([held])
    assert set(annotations) == {FROM, SIG_FROM, ISOLATION, SIG_ISOLATION}
    assert ids.verify(KEY, ids.KIND_FROM, NODE, "*", annotations[FROM], annotations[SIG_FROM])
    assert ids.verify(KEY, ids.KIND_ISOLATION, NODE, "*", annotations[ISOLATION],
                      annotations[SIG_ISOLATION])
    caps = parse_share_caps(ISOLATION, annotations[ISOLATION])
    assert caps == ShareCaps("mps", "nvidia.com/gpu", "gpushare-system/mps-a", spec, len(held), 81920)


@pytest.mark.parametrize(("memory", "opt_out", "expected"), [
    ({}, False, {"card_memory_mib": None, "opt_out": False}),
    ({"nvidia.com/gpu": 24576}, True, {"card_memory_mib": 24576, "opt_out": True}),
    ({"amd.com/gpu": 65536}, False, {"card_memory_mib": None, "opt_out": False}),
])
def test_card_memory_and_opt_out_come_from_the_settings(memory: dict[str, int], opt_out: bool,
                                                        expected: dict[str, Any]) -> None:
    [annotations] = capped(memory=memory, opt_out=opt_out).allocate([["gpushare-system/mps-a-1"]])
    caps = parse_share_caps(ISOLATION, annotations[ISOLATION])
    assert {"card_memory_mib": caps.card_memory_mib, "opt_out": caps.opt_out} == expected


def test_soft_shares_are_signed_as_before() -> None:
    [annotations] = capped().allocate([["gpushare-system/soft-b-0", "gpushare-system/soft-b-3"]])
    assert set(annotations) == {FROM, SIG_FROM}


@pytest.mark.parametrize(("request_ids", "reason"), [
    (["gpushare-system/mps-a-0", "gpushare-system/soft-b-0"], "cannot be combined with others"),
    (["gpushare-system/bare-c-0"], "is capped but requests no card"),
])
def test_caps_that_cannot_be_signed_refuse_the_allocation(request_ids: list[str], reason: str) -> None:
    with pytest.raises(PluginError, match=reason) as refused:
        capped().allocate([request_ids])
    assert refused.value.code == "invalid-argument"


def test_status_shows_soft_shares() -> None:
    assert capped().status()["isolation"] == {"gpushare-system/bare-c": "mps",
                                              "gpushare-system/mps-a": "mps",
                                              "gpushare-system/soft-b": "soft share"}


def shadow_pod(isolation: str | None, ready: bool) -> dict[str, Any]:
    notes = {ids.ANN_SHARE_SPEC: "4", ids.ANN_SHARE_KIND: "share-dev"}
    if isolation is not None:
        notes[ids.ANN_ISOLATION] = isolation
    return {
        "metadata": {"namespace": "gpushare-system", "name": "sh", "annotations": notes,
                     "labels": {ids.LABEL_POD_DESCRIPTION: ids.SHADOW_POD_LABEL_VALUE,
                                "app.kubernetes.io/managed-by": "gpushare-shadow-controller"}},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1",
                                                                         "cpu": "1"}}}]},
        "status": {"phase": "Running",
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


@pytest.mark.parametrize(("isolation", "ready", "seen"), [
    (None, False, True), (None, True, True), ("mps", False, False), ("mps", True, True),
])
def test_a_capped_shadow_pod_counts_once_its_daemon_is_ready(isolation: str | None, ready: bool,
                                                              seen: bool) -> None:
    view = shadow_view(shadow_pod(isolation, ready), PodRules())
    assert (view is not None) == seen
    if view is not None:
        assert (view.isolation, view.vendor_resource) == (isolation or "", "nvidia.com/gpu")


def test_settings_for_caps() -> None:
    settings = load(DevicePluginSettings, PREFIX, {
        "GPUSHARE_DP_CARD_MEMORY_MIB": "nvidia.com/gpu=81920, example.com/npu=32768",
        "GPUSHARE_DP_ISOLATION_OPT_OUT": "share-dev"})
    assert settings.card_memory() == {"nvidia.com/gpu": 81920, "example.com/npu": 32768}
    logics = build_logics(settings, Signer(KEY, NODE))
    opt_out = {token: logic.opt_out for token, logic in logics.items() if isinstance(logic, ShareLogic)}
    assert opt_out["share-dev-gpu-4"] and not opt_out["share-gpu-4"]


@pytest.mark.parametrize(("variable", "value"), [
    ("GPUSHARE_DP_CARD_MEMORY_MIB", "nvidia.com/gpu=80G"),
    ("GPUSHARE_DP_CARD_MEMORY_MIB", "nvidia.com/gpu=0"),
    ("GPUSHARE_DP_ISOLATION_OPT_OUT", "inference"),
])
def test_bad_cap_settings_name_the_variable(variable: str, value: str) -> None:
    with pytest.raises(SettingsError, match=variable):
        load(DevicePluginSettings, PREFIX, {variable: value})


def isolation_series(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    return {(s.labels["resource"], s.labels["isolation"]): s.value for m in registry.collect()
            if m.name == "gpushare_share_isolation" for s in m.samples}


def test_share_isolation_metric_follows_the_shadow_pods(settings: DevicePluginSettings) -> None:
    registry = CollectorRegistry()
    plugins = PluginSet(settings, Signer(KEY, NODE), PluginMetrics(registry))
    assert isolation_series(registry) == {}  # no ShadowPod yet: nothing is claimed
    plugins.replace_shadows([
        ShadowPodView("gpushare-system", "mps-a", "share", 4, vendor_resource="nvidia.com/gpu", isolation="mps"),
        ShadowPodView("gpushare-system", "mps-b", "share", 4, vendor_resource="nvidia.com/gpu", isolation="mps"),
        ShadowPodView("gpushare-system", "soft-c", "share-dev", 8, vendor_resource="nvidia.com/gpu"),
    ])
    assert isolation_series(registry) == {("gpushare/share-gpu-4", "mps"): 1,
                                          ("gpushare/share-dev-gpu-8", "none"): 1}
    plugins.replace_shadows([ShadowPodView("gpushare-system", "soft-c", "share-dev", 8)])
    assert isolation_series(registry) == {("gpushare/share-dev-gpu-8", "none"): 1}  # stale series dropped
