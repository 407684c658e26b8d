"""The chart's dra switch: the driver's DaemonSet, its RBAC (exactly the driver's and the
solver's DRA calls), gpushare's DeviceClasses (as gpushare_common.dra defines them), and a node
left to either the device plugins or the driver."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml
from gpushare_common import dra
from gpushare_dra_driver.settings import DraSettings

from tests.deploy.chart import _helm, render
from tests.deploy.test_chart import env_of, find
from tests.deploy.test_rbac import adapter_operations, compare, granted, needed_grants, package_dir

ON = {"dra": {"enabled": True, "cardMemoryMiB": {"nvidia.com/gpu": 81920}}}


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return render(ON)


def rendered_on(version: str, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The chart as helm renders it for a cluster of ``version`` serving resource.k8s.io/v1."""
    text = _helm(["--kube-version", version, "--api-versions", "resource.k8s.io/v1"], values or ON, [])
    return [d for d in yaml.safe_load_all(text) if d]


def classes(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "DeviceClass"]


def test_device_classes_are_gpushare_common_s(docs: list[dict[str, Any]]) -> None:
    assert classes(docs) == dra.device_classes()  # helm's default cluster: no extended resources


@pytest.mark.parametrize("version, extended", [("1.35.0", False), ("1.36.0", True), ("1.37.2", True)])
def test_device_classes_serve_the_extended_resources_where_the_cluster_does(version: str, extended: bool) -> None:
    """DRAExtendedResource (and partitionable devices) are on by default from 1.36: the chart reads
    the cluster's version and APIs (.Capabilities) and names every gpushare extended resource."""
    docs = rendered_on(version)
    specs = ((2, 3, 4, 5), (2, 4, 8, 16))
    assert classes(docs) == dra.device_classes(*specs, extended=extended)
    (container,) = find(docs, "DaemonSet", "gpushare-dra-driver")["spec"]["template"]["spec"]["containers"]
    env = env_of(container)
    assert (env.get("GPUSHARE_DRA_EXTENDED_SHARE_SPECS"), env.get("GPUSHARE_DRA_EXTENDED_DEV_SPECS")) == \
        (("2,3,4,5", "2,4,8,16") if extended else (None, None))
    forced = classes(rendered_on("1.34.0", {"dra": {**ON["dra"], "extendedResources": True}}))
    assert forced == dra.device_classes(*specs, extended=True), "forced on a 1.34 cluster with the gates on"


@pytest.mark.parametrize("service, account", [("dra-driver", "gpushare-dra-driver"), ("solver", "gpushare-solver")])
def test_dra_rbac_grants_exactly_the_dra_calls(docs: list[dict[str, Any]], service: str, account: str) -> None:
    operations = adapter_operations()
    needed = needed_grants(package_dir(service), operations, service, dra=True)
    assert needed, f"{service} makes DRA calls"
    others = needed_grants(package_dir("dra-driver"), operations, "dra-driver")
    assert {(g.group, g.resource, g.verb) for g in others} == {("", "events", "create")}, \
        "the driver's only other API call records Events on pods"
    if service == "dra-driver":
        needed |= others
    dra_docs = [d for d in docs if "dra" in d["metadata"]["name"] or d["kind"] == "ServiceAccount"]
    missing, unused = compare({g for g in granted(dra_docs).get(account, set())}, needed)
    assert (missing, unused) == ([], []), f"{account}: missing {missing}, unused {unused}"


def test_the_driver_runs_on_dra_nodes_and_the_device_plugins_leave_them(docs: list[dict[str, Any]]) -> None:
    driver = find(docs, "DaemonSet", "gpushare-dra-driver")["spec"]["template"]["spec"]
    plugin = find(docs, "DaemonSet", "gpushare-deviceplugin")["spec"]["template"]["spec"]
    term = "requiredDuringSchedulingIgnoredDuringExecution"
    assert driver["affinity"]["nodeAffinity"][term]["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "gpushare.k8s.io/dra", "operator": "In", "values": ["true"]}]
    assert plugin["affinity"]["nodeAffinity"][term]["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "gpushare.k8s.io/dra", "operator": "NotIn", "values": ["true"]}]
    assert "affinity" not in find(render(), "DaemonSet", "gpushare-deviceplugin")["spec"]["template"]["spec"]


def test_the_drivers_settings_and_paths_are_its_own(docs: list[dict[str, Any]]) -> None:
    spec = find(docs, "DaemonSet", "gpushare-dra-driver")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = env_of(container)
    fields = {f"GPUSHARE_DRA_{f.name.upper()}" for f in dataclasses.fields(DraSettings)}
    assert {k for k in env if k.startswith("GPUSHARE_DRA_")} <= fields
    assert env["GPUSHARE_DRA_CARD_MEMORY_MIB"] == "nvidia.com/gpu=81920"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    defaults = DraSettings()
    assert {defaults.registry_dir, defaults.plugin_dir, defaults.cdi_dir, defaults.device_plugin_dir,
            defaults.isolation_dir} <= mounts
    solver = env_of(find(docs, "DaemonSet", "gpushare-solver")["spec"]["template"]["spec"]["containers"][0])
    assert solver["GPUSHARE_SOLVER_DRA_TAINTS"] == "true"
    assert "GPUSHARE_SOLVER_DRA_TAINTS" not in env_of(
        find(render(), "DaemonSet", "gpushare-solver")["spec"]["template"]["spec"]["containers"][0])


def test_the_driver_is_the_dra_driver_nats_role_on_its_nodes_leaf(docs: list[dict[str, Any]]) -> None:
    """The dra-driver user of its node's leaf server, with that role's password file only (not the
    device plugin's: each keeps only its own permissions); no token, no connection to the cluster."""
    spec = find(docs, "DaemonSet", "gpushare-dra-driver")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = env_of(container)
    assert env["GPUSHARE_NATS_USER"] == "dra-driver" and env["GPUSHARE_NATS_URL"] == "nats://$(NODE_IP):4224"
    assert "GPUSHARE_NATS_TOKEN_FILE" not in env and "GPUSHARE_NATS_PASSWORD" not in env
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == env["GPUSHARE_NATS_PASSWORD_FILE"]]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"] == {"path": "/var/lib/gpushare/nats-leaf/users/dra-driver", "type": "File"}


def test_a_rolling_update_starts_the_new_driver_beside_the_old_one(docs: list[dict[str, Any]]) -> None:
    """Each driver pod's sockets are named after its UID, and the new pod starts before the old one
    goes (the kubelet moves to the newest registered instance)."""
    daemonset = find(docs, "DaemonSet", "gpushare-dra-driver")
    assert daemonset["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                                   "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert env_of(container)["GPUSHARE_DRA_INSTANCE"] == {"fieldRef": {"fieldPath": "metadata.uid"}}


def test_the_driver_can_run_the_nodes_mps_daemon(docs: list[dict[str, Any]]) -> None:
    """The daemon is the driver's child: every card (the NVIDIA runtime) and, as /dev/shm, the host
    directory each capped share mounts as its own (DraSettings.mps_dir + /shm)."""
    spec = find(docs, "DaemonSet", "gpushare-dra-driver")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert spec["runtimeClassName"] == "nvidia" and env_of(container)["NVIDIA_VISIBLE_DEVICES"] == "all"
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["path"] == f"{DraSettings().mps_dir}/shm"
    off = find(render({"dra": {**ON["dra"], "mps": {"enabled": False}}}), "DaemonSet", "gpushare-dra-driver")
    (plain,) = off["spec"]["template"]["spec"]["containers"]
    assert "runtimeClassName" not in off["spec"]["template"]["spec"]
    assert env_of(plain)["GPUSHARE_DRA_MPS_PROFILES"] == "" and DraSettings(mps_profiles=()).mps_profiles == ()
