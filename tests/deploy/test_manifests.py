"""k8s/ manifests (k8s/base, rendered from the chart, and the kernel-module component): every
object validates against the Kubernetes schemas offline; the kustomizations reference files that
exist; workloads run as their own service accounts and images built here; services on the host
network listen on the node's address only."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart import render

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
KUBE_VERSION = "1.30"  # the oldest Kubernetes the manifests support (ValidatingAdmissionPolicy v1)
MANIFESTS = sorted(p for p in (K8S / "base").glob("*.yaml") if p.name != "kustomization.yaml")
KMOD_PATCH = K8S / "components" / "kmod" / "kmod-bridge.yaml"
WORKLOADS = ("DaemonSet", "Deployment", "StatefulSet")


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def workloads() -> list[dict[str, Any]]:
    return [d for p in [*MANIFESTS, KMOD_PATCH] for d in documents(p) if d["kind"] in WORKLOADS]


@pytest.mark.parametrize("path", [*MANIFESTS, KMOD_PATCH], ids=lambda p: p.name)
def test_manifest_validates_against_kubernetes_schema(path: Path) -> None:
    for doc in documents(path):
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_bad_manifest_is_rejected() -> None:
    (doc,) = [d for d in documents(K8S / "base" / "shadow-controller.yaml") if d["kind"] == "Deployment"]
    doc["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_kustomization_references_existing_files() -> None:
    kustomization = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (K8S / "base" / resource).is_file(), resource
    overlay = yaml.safe_load((K8S / "overlays" / "with-kmod" / "kustomization.yaml").read_text())
    for component in overlay["components"]:
        component_dir = K8S / "overlays" / "with-kmod" / component
        for patch in yaml.safe_load((component_dir / "kustomization.yaml").read_text())["patches"]:
            assert (component_dir / patch["path"]).is_file(), patch


def test_service_accounts_and_images_exist_for_every_workload() -> None:
    accounts = {d["metadata"]["name"] for d in documents(K8S / "base" / "rbac.yaml") if d["kind"] == "ServiceAccount"}
    dockerfiles = {p.parent.name for p in (ROOT / "services").glob("*/Dockerfile")}
    for doc in workloads():
        pod = doc["spec"]["template"]["spec"]
        account = pod.get("serviceAccountName")
        assert account is None or account in accounts, (doc["metadata"]["name"], account)
        for container in pod["containers"]:
            match = re.fullmatch(r"gpushare/([\w-]+):[\w.-]+", container["image"])
            if match and match.group(1) != "node-installer":
                assert match.group(1) in dockerfiles, container["image"]


def test_host_network_services_listen_on_localhost_only() -> None:
    """On the host network no NetworkPolicy applies: a service's HTTP port (``/status`` and
    ``/metrics`` included) is bound to 127.0.0.1, not the node's address where every pod of the
    node would reach it; the kubelet's probes (from the node's own namespace) name that host."""
    on_host = [d for d in workloads() if d["spec"]["template"]["spec"].get("hostNetwork")]
    assert {d["metadata"]["name"] for d in on_host} >= {"gpushare-kmod-bridge", "gpushare-nats-leaf"}
    host_ip = {"valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}
    for doc in on_host:
        for container in doc["spec"]["template"]["spec"]["containers"]:
            env = {e["name"]: e for e in container.get("env", [])}
            if container["name"] == "nats":  # the node's leaf server: its configuration says where
                (config,) = [d for d in documents(K8S / "base" / "nats-leaf.yaml") if d["kind"] == "ConfigMap"]
                assert "host: $NODE_IP" in config["data"]["leaf.conf"]
                assert env["NODE_IP"] == {"name": "NODE_IP", **host_ip}
                for probe in ("livenessProbe", "readinessProbe"):
                    if probe in container:
                        assert "host" not in container[probe]["httpGet"], (doc["metadata"]["name"], probe)
                continue
            if "GPUSHARE_HTTP_PORT" not in env and "readinessProbe" not in container:
                continue  # serves nothing over HTTP
            assert env["GPUSHARE_HTTP_HOST"] == {"name": "GPUSHARE_HTTP_HOST", "value": "127.0.0.1"}
            for probe in ("livenessProbe", "readinessProbe"):
                assert container[probe]["httpGet"]["host"] == "127.0.0.1", (doc["metadata"]["name"], probe)


def test_a_host_network_service_on_the_node_address_only_when_asked() -> None:
    docs = render({"kmodBridge": {"httpListen": "nodeAddress"}})
    (bridge,) = [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "gpushare-kmod-bridge"]
    (container,) = bridge["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["GPUSHARE_HTTP_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert "host" not in container["livenessProbe"]["httpGet"]


def test_node_install_is_idempotent(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "usr" / "bin").mkdir(parents=True)
    (host / "usr" / "bin" / "python3").write_text("")
    (host / "usr" / "bin" / "python3").chmod(0o755)
    script = K8S / "node-install.sh"
    env = {"PATH": "/usr/bin:/bin", "GPUSHARE_CONFIG_DIR": str(tmp_path / "none"), "GPUSHARE_NODE_NAME": "gpu-7.x"}
    first = subprocess.run([str(script), str(host)], capture_output=True, text=True, env=env, check=True)
    assert "creating the node signing key" in first.stdout
    key = host / "etc" / "gpushare" / "signing.key"
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_text()) == 64
    launcher = (host / "usr" / "local" / "bin" / "gpushare-runtime").read_text()
    assert "'/usr/bin/python3' -I -S" in launcher and "/opt/gpushare/runtime/runtime" in launcher
    assert (host / "opt/gpushare/runtime/runtime/gpushare_runtime/main.py").is_file()
    assert (host / "etc/containerd/conf.d/gpushare.toml").is_file()
    assert (host / "opt/gpushare/runtime/common/gpushare_common/isolation.py").is_file()
    config = json.loads((host / "etc/gpushare/runtime.json").read_text())
    assert config["node_name"] == "gpu-7.x" and config["lower_runtime"] == "runc"
    before = key.read_text()
    second = subprocess.run([str(script), str(host)], capture_output=True, text=True, env=env, check=True)
    assert "creating the node signing key" not in second.stdout and key.read_text() == before
    assert json.loads((host / "etc/gpushare/runtime.json").read_text()) == config


def test_node_install_refuses_a_node_name_that_is_not_one(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "usr" / "bin").mkdir(parents=True)
    (host / "usr" / "bin" / "python3").write_text("")
    (host / "usr" / "bin" / "python3").chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "GPUSHARE_CONFIG_DIR": str(tmp_path / "none"), "GPUSHARE_NODE_NAME": "a b\"c"}
    result = subprocess.run([str(K8S / "node-install.sh"), str(host)], capture_output=True, text=True, env=env)
    assert result.returncode == 1 and "set GPUSHARE_NODE_NAME" in result.stderr


def test_node_install_without_python_says_what_to_do(tmp_path: Path) -> None:
    result = subprocess.run([str(K8S / "node-install.sh"), str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 1 and "install python3 >= 3.11" in result.stderr


def test_node_install_brings_the_kubelet_client_for_the_nodes_python(tmp_path: Path) -> None:
    """A create that copies from another pod asks the kubelet: the pod-resources client and the
    node's python's grpcio/protobuf (prepared in the installer image) reach the node."""
    host, site = tmp_path / "host", tmp_path / "site"
    (host / "usr" / "bin").mkdir(parents=True)
    (host / "usr" / "bin" / "python3.12").write_text("")
    (host / "usr" / "bin" / "python3.12").chmod(0o755)
    (host / "usr" / "bin" / "python3").symlink_to("python3.12")
    (site / "3.12" / "grpc").mkdir(parents=True)
    env = {"PATH": "/usr/bin:/bin", "GPUSHARE_CONFIG_DIR": str(tmp_path / "none"), "GPUSHARE_NODE_NAME": "gpu-7",
           "GPUSHARE_RUNTIME_SITE": str(site)}
    subprocess.run([str(K8S / "node-install.sh"), str(host)], capture_output=True, text=True, env=env, check=True)
    runtime = host / "opt/gpushare/runtime"
    assert (runtime / "site/grpc").is_dir()
    assert (runtime / "common/gpushare_common/adapters/podresources.py").is_file()
    assert (runtime / "common/gpushare_common/adapters/kubeletapi/podresources_v1_pb2.py").is_file()
    assert 'sys.path += ["/opt/gpushare/runtime/site"]' in (host / "usr/local/bin/gpushare-runtime").read_text()
