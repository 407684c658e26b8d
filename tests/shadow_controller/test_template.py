"""The ShadowPod template: unchanged without MPS; with MPS, main runs the control daemon."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest
from gpushare_common import ids
from gpushare_common.mapping import QuotaKey
from gpushare_common.settings import SettingsError, load
from gpushare_shadow_controller.settings import ShadowSettings
from gpushare_shadow_controller.template import MPS_SCRIPT, shadow_pod

SHARE = QuotaKey("gpushare-system", "share", 4)
DEV = QuotaKey("gpushare-system", "share-dev", 8)
PLAIN = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "sh-1", "namespace": "gpushare-system",
                 "labels": {ids.LABEL_POD_DESCRIPTION: ids.SHADOW_POD_LABEL_VALUE,
                            "app.kubernetes.io/managed-by": "gpushare-shadow-controller"},
                 "annotations": {ids.ANN_SHARE_KIND: "share", ids.ANN_SHARE_SPEC: "4"}},
    "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                             "resources": {"limits": {"nvidia.com/gpu": "1"},
                                           "requests": {"nvidia.com/gpu": "1"}}}],
             "automountServiceAccountToken": False,
             "restartPolicy": "Always", "terminationGracePeriodSeconds": 0, "tolerations": []},
}


@pytest.mark.parametrize("mps_kinds", [(), ("share-dev",)])
def test_without_mps_the_shadow_pod_is_unchanged(mps_kinds: tuple[str, ...]) -> None:
    assert shadow_pod(SHARE, "sh-1", ShadowSettings(mps_kinds=mps_kinds)) == PLAIN


@pytest.mark.parametrize("quota", [SHARE, DEV])
def test_with_mps_main_runs_the_daemon_on_the_shadow_pods_directories(quota: QuotaKey) -> None:
    settings = ShadowSettings(mps_kinds=("share", "share-dev"), isolation_host_path="/run/iso")
    pod = shadow_pod(quota, "sh-1", settings)
    assert pod["metadata"]["annotations"][ids.ANN_ISOLATION] == "mps"
    (main,) = pod["spec"]["containers"]
    assert main["name"] == "main" and main["image"] == settings.mps_image
    assert main["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert main["command"] == ["/bin/sh", "-c", MPS_SCRIPT]
    env = {e["name"]: e["value"] for e in main["env"]}
    assert env == {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
                   "CUDA_MPS_LOG_DIRECTORY": "/var/log/nvidia-mps",
                   "NVIDIA_DRIVER_CAPABILITIES": "compute,utility", "GPUSHARE_SHARES": str(quota.spec)}
    mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
    hosts = {v["name"]: v["hostPath"] for v in pod["spec"]["volumes"]}
    assert {mounts[n]: hosts[n]["path"] for n in mounts} == {
        "/tmp/nvidia-mps": "/run/iso/gpushare-system_sh-1/pipe",
        "/var/log/nvidia-mps": "/run/iso/gpushare-system_sh-1/log",
        "/dev/shm": "/run/iso/gpushare-system_sh-1/shm"}
    assert {h["type"] for h in hosts.values()} == {"DirectoryOrCreate"}
    probe = main["readinessProbe"]["exec"]["command"]
    assert probe[-1] == "echo get_default_active_thread_percentage | nvidia-cuda-mps-control"


def test_the_daemon_script_is_posix_shell() -> None:
    shell = shutil.which("dash") or shutil.which("sh")
    assert shell is not None
    result = subprocess.run([shell, "-n", "-c", MPS_SCRIPT], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("environ", "variable"), [
    ({"GPUSHARE_SHADOW_MPS_KINDS": "share,inference"}, "GPUSHARE_SHADOW_MPS_KINDS"),
    ({"GPUSHARE_SHADOW_ISOLATION_HOST_PATH": "run/iso"}, "GPUSHARE_SHADOW_ISOLATION_HOST_PATH"),
])
def test_bad_mps_settings_name_the_variable(environ: dict[str, str], variable: str) -> None:
    with pytest.raises(SettingsError, match=variable):
        load(ShadowSettings, "GPUSHARE_SHADOW_", environ)


def test_mps_settings_from_the_environment() -> None:
    settings: Any = load(ShadowSettings, "GPUSHARE_SHADOW_", {"GPUSHARE_SHADOW_MPS_KINDS": "share-dev",
                                                             "GPUSHARE_SHADOW_MPS_IMAGE": "cuda:base"})
    assert settings.mps_kinds == ("share-dev",) and settings.mps_image == "cuda:base"


def test_a_profile_without_a_daemon_only_annotates_the_shadow_pod() -> None:
    settings = ShadowSettings(isolation_profiles={"share": "sim_caps"})
    pod = shadow_pod(SHARE, "sh-1", settings)
    expected = {**PLAIN["metadata"]["annotations"], ids.ANN_ISOLATION: "sim_caps"}
    assert pod["metadata"]["annotations"] == expected
    assert pod["spec"] == PLAIN["spec"]  # the pause container: the vendor's driver enforces the caps
    assert shadow_pod(DEV, "sh-1", settings)["metadata"]["annotations"].get(ids.ANN_ISOLATION) is None


def test_a_share_resource_wins_over_its_kind() -> None:
    settings = ShadowSettings(mps_kinds=("share-dev",),
                              isolation_profiles={"share": "sim_caps", "share-gpu-4": "mps", "share-dev-gpu-8": "x"})
    assert (settings.isolation_of("share", 4), settings.isolation_of("share", 2)) == ("mps", "sim_caps")
    assert (settings.isolation_of("share-dev", 8), settings.isolation_of("share-dev", 2)) == ("x", "mps")
    pod = shadow_pod(SHARE, "sh-1", settings)  # mps by its resource: main runs the daemon
    assert pod["metadata"]["annotations"][ids.ANN_ISOLATION] == "mps"
    assert pod["spec"]["containers"][0]["command"] == ["/bin/sh", "-c", MPS_SCRIPT]
    dev = shadow_pod(DEV, "sh-2", settings)
    assert dev["metadata"]["annotations"][ids.ANN_ISOLATION] == "x" and "command" not in dev["spec"]["containers"][0]
    assert ShadowSettings().isolation_of("share", 4) == ""


def test_isolation_profiles_from_the_environment() -> None:
    settings: Any = load(ShadowSettings, "GPUSHARE_SHADOW_", {
        "GPUSHARE_SHADOW_ISOLATION_PROFILES": "share-gpu-3=sim_caps, share-dev=npu_caps"})
    assert settings.isolation_profiles == {"share-gpu-3": "sim_caps", "share-dev": "npu_caps"}


@pytest.mark.parametrize(("environ", "expected"), [
    ({"GPUSHARE_SHADOW_ISOLATION_PROFILES": "inference=mps"}, "share, share-dev or a share resource"),
    ({"GPUSHARE_SHADOW_ISOLATION_PROFILES": "share-gpu-0=mps"}, "share, share-dev or a share resource"),
    ({"GPUSHARE_SHADOW_ISOLATION_PROFILES": "gpushare/share-gpu-4=mps"}, "share, share-dev or a share resource"),
    ({"GPUSHARE_SHADOW_ISOLATION_PROFILES": "share=none"}, "not 'none'"),
    ({"GPUSHARE_SHADOW_ISOLATION_PROFILES": "share=sim-caps"}, "an isolation profile name"),
    ({"GPUSHARE_SHADOW_ISOLATION_PROFILES": "share="}, "an isolation profile name"),
    ({"GPUSHARE_SHADOW_ISOLATION_PROFILES": "share"}, "key=value"),
    ({"GPUSHARE_SHADOW_ISOLATION_PROFILES": "share=x", "GPUSHARE_SHADOW_MPS_KINDS": "share"},
     "not in GPUSHARE_SHADOW_MPS_KINDS"),
])  # fmt: skip
def test_bad_isolation_profiles_say_what_is_expected(environ: dict[str, str], expected: str) -> None:
    with pytest.raises(SettingsError, match="GPUSHARE_SHADOW_ISOLATION_PROFILES") as caught:
        load(ShadowSettings, "GPUSHARE_SHADOW_", environ)
    assert expected in str(caught.value)


def test_a_shadow_pod_made_for_a_placement_carries_it() -> None:
    from gpushare_shadow_controller.placement import Placement

    affinity = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}
    placement = Placement.of({"kubernetes.io/hostname": "n2"}, affinity)
    pod = shadow_pod(SHARE, "sh-1", ShadowSettings(node_selector="gpushare.k8s.io/gpu=true"), placement)
    assert pod["spec"]["nodeSelector"] == {"gpushare.k8s.io/gpu": "true", "kubernetes.io/hostname": "n2"}
    assert pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == affinity
    assert Placement.of_annotation(pod["metadata"]["annotations"][ids.ANN_PLACEMENT]) == placement
