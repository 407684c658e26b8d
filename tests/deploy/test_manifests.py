"""k8s/ manifests: every object validates against the Kubernetes schemas offline; the
kustomizations reference files that exist; copies of the runtime's install material match."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
KUBE_VERSION = "1.31"
MANIFESTS = sorted(p for p in (K8S / "base").glob("*.yaml") if p.name != "kustomization.yaml")


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates_against_kubernetes_schema(path: Path) -> None:
    for doc in documents(path):
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_kmod_component_patch_validates_once_merged() -> None:
    (daemonset,) = documents(K8S / "base" / "kmod-bridge.yaml")
    (patch,) = documents(K8S / "components" / "kmod" / "kmod-installer.yaml")
    spec = daemonset["spec"]["template"]["spec"]
    spec["initContainers"] = patch["spec"]["template"]["spec"]["initContainers"]
    spec["volumes"] = spec.get("volumes", []) + patch["spec"]["template"]["spec"]["volumes"]
    kubernetes_validate.validate(daemonset, KUBE_VERSION, strict=True)


def test_bad_manifest_is_rejected() -> None:
    (doc,) = documents(K8S / "base" / "shadow-controller.yaml")
    doc["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_kustomization_references_existing_files() -> None:
    kustomization = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (K8S / "base" / resource).is_file(), resource
    for generator in kustomization["configMapGenerator"]:
        for name in generator["files"]:
            assert (K8S / "base" / name).is_file(), name
    overlay = yaml.safe_load((K8S / "overlays" / "with-kmod" / "kustomization.yaml").read_text())
    for component in overlay["components"]:
        assert (K8S / "overlays" / "with-kmod" / component / "kustomization.yaml").is_file()


@pytest.mark.parametrize(("copy", "original"), [
    ("runtimeclass.yaml", "runtimeclass.yaml"),
    ("containerd-gpushare.toml", "containerd-gpushare.toml"),
    ("runtime.json", "runtime.json.example"),
])
def test_install_material_copies_match_the_runtime(copy: str, original: str) -> None:
    assert (K8S / "base" / copy).read_text() == (ROOT / "runtime" / "install" / original).read_text()


def test_service_accounts_and_images_exist_for_every_workload() -> None:
    accounts = {d["metadata"]["name"] for d in documents(K8S / "base" / "rbac.yaml")
                if d["kind"] == "ServiceAccount"}
    dockerfiles = {p.parent.name for p in (ROOT / "services").glob("*/Dockerfile")}
    for path in MANIFESTS:
        for doc in documents(path):
            if doc["kind"] not in ("DaemonSet", "Deployment", "StatefulSet"):
                continue
            pod = doc["spec"]["template"]["spec"]
            account = pod.get("serviceAccountName")
            assert account is None or account in accounts, (path.name, account)
            for container in pod["containers"]:
                image = container["image"]
                if image.startswith("gpushare/") and image != "gpushare/node-installer":
                    assert image.removeprefix("gpushare/") in dockerfiles, image


def test_node_install_is_idempotent(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "usr" / "bin").mkdir(parents=True)
    (host / "usr" / "bin" / "python3").write_text("")
    (host / "usr" / "bin" / "python3").chmod(0o755)
    script = K8S / "node-install.sh"
    env = {"PATH": "/usr/bin:/bin", "GPUSHARE_CONFIG_DIR": str(tmp_path / "none")}
    first = subprocess.run([str(script), str(host)], capture_output=True, text=True, env=env, check=True)
    assert "creating the node signing key" in first.stdout
    key = host / "etc" / "gpushare" / "signing.key"
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_text()) == 64
    launcher = (host / "usr" / "local" / "bin" / "gpushare-runtime").read_text()
    assert "'/usr/bin/python3' -I -S" in launcher and "/opt/gpushare/runtime/runtime" in launcher
    assert (host / "opt/gpushare/runtime/runtime/gpushare_runtime/main.py").is_file()
    assert (host / "etc/containerd/conf.d/gpushare.toml").is_file()
    before = key.read_text()
    second = subprocess.run([str(script), str(host)], capture_output=True, text=True, env=env, check=True)
    assert "creating the node signing key" not in second.stdout and key.read_text() == before


def test_node_install_without_python_says_what_to_do(tmp_path: Path) -> None:
    result = subprocess.run([str(K8S / "node-install.sh"), str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 1 and "install python3 >= 3.11" in result.stderr
