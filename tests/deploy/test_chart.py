"""The Helm chart k8s/chart/gpushare, rendered by a real helm for several value sets: every object
validates against the Kubernetes schemas, each switch renders what it says, and k8s/base (built
with a real kubectl kustomize) is the chart's rendering."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy import chart, tools
from tests.deploy.chart import NAMESPACE, ROOT, RenderError, render

KUBE_VERSIONS = ("1.30", "1.33")  # the chart's minimum (admission policies v1) and kubectl's
DRA_VERSIONS = ("1.34", "1.37")  # resource.k8s.io/v1 (the dra switch) is 1.34's and later
EXTERNAL = {"nats": {"enabled": False, "external": {"urls": ["nats://a.example:4222", "nats://b.example:4222"],
                                                    "leafUrls": ["nats-leaf://a.example:7422", "nats-leaf://b.example:7422"]},
                     "auth": {"existingSecret": "my-nats", "existingIssuerSecret": "my-issuer"}}}  # fmt: skip
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "kmod on": {"kernelModule": {"enabled": True}},
    "external NATS": EXTERNAL,
    "console on": {"console": {"enabled": True}},
    "overselling off": {"overselling": {"enabled": False}},
    "1 NATS replica": {"nats": {"replicas": 1}},
    "5 NATS replicas": {"nats": {"replicas": 5}},
    "device plugins off, dra on": {"devicePlugins": {"enabled": False}, "dra": {"enabled": True}},
    "registry and pull secret": {"images": {"registry": "registry.example.com/", "tag": "1.2.3",
                                            "pullSecrets": ["regcred"]}},
    "shadow namespace": {"shadow": {"namespace": "gpushare-shadow"}},
    "no admission policies": {"admission": {"enabled": False}},
}


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} rendered"
    return found[0]


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def service_env(docs: list[dict[str, Any]], workload: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] in ("DaemonSet", "Deployment") and d["metadata"]["name"] == workload]
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    return env_of(container)


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: render(values) for name, values in VALUE_SETS.items()}


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_rendered_object_validates(rendered: dict[str, list[dict[str, Any]]], value_set: str) -> None:
    for doc in rendered[value_set]:
        dra = doc["apiVersion"].startswith("resource.k8s.io/")
        for version in DRA_VERSIONS if dra else KUBE_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def test_a_broken_object_is_caught(rendered: dict[str, list[dict[str, Any]]]) -> None:
    policy = dict(find(rendered["defaults"], "ValidatingAdmissionPolicy", "gpushare-solver-own-node"))
    policy["spec"] = {**policy["spec"], "validations": [{"expresion": "true"}]}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(policy, "1.30", strict=True)


def test_defaults_run_a_three_server_nats_cluster(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["defaults"]
    statefulset = find(docs, "StatefulSet", "gpushare-nats")
    spec = statefulset["spec"]
    assert spec["replicas"] == 3 and spec["serviceName"] == "gpushare-nats-headless"
    headless = find(docs, "Service", "gpushare-nats-headless")["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    assert find(docs, "PodDisruptionBudget", "gpushare-nats")["spec"]["maxUnavailable"] == 1
    pod = spec["template"]["spec"]
    (spread, *_) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["whenUnsatisfiable"] == "DoNotSchedule"
    assert pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    (nats,) = pod["containers"]
    assert nats["args"] == ["-c", "/etc/nats/cluster.conf"]
    routes = [v for k, v in env_of(nats).items() if k.startswith("ROUTE_") and k != "ROUTE_PASSWORD"]
    assert routes == [f"nats://route:$(ROUTE_PASSWORD)@gpushare-nats-{i}.gpushare-nats-headless.{NAMESPACE}"
                      f".svc.cluster.local:6222" for i in range(3)]  # fmt: skip
    assert "routes: [$ROUTE_0, $ROUTE_1, $ROUTE_2]" in find(docs, "ConfigMap", "nats-config")["data"]["cluster.conf"]


NODE_SERVICES = {"gpushare-detector": "detector", "gpushare-solver": "solver", "gpushare-deviceplugin": "deviceplugin",
                 "gpushare-kmod-bridge": "kmod-bridge"}


def leaf_args(docs: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The commands of the leaf pod's init container and agent."""
    pod = find(docs, "DaemonSet", "gpushare-nats-leaf")["spec"]["template"]["spec"]
    (config,) = pod["initContainers"]
    agent = next(c for c in pod["containers"] if c["name"] == "agent")
    return config["command"], agent["command"]


def test_every_node_service_uses_its_nodes_leaf_as_its_role(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The node services connect to the leaf server on their node's address, as their role's user there,
    with the password file of that role only; never to the cluster, never with a token."""
    for value_set in ("defaults", "external NATS", "1 NATS replica"):
        docs = rendered[value_set]
        for workload, role in NODE_SERVICES.items():
            env = service_env(docs, workload)
            assert env["GPUSHARE_NATS_URL"] == "nats://$(NODE_IP):4224" and env["NODE_IP"]["fieldRef"] == \
                {"fieldPath": "status.hostIP"}, workload
            assert env["GPUSHARE_NATS_USER"] == role and env["GPUSHARE_NATS_STREAM_REPLICAS"] == "1", workload
            assert "GPUSHARE_NATS_TOKEN_FILE" not in env and "GPUSHARE_NATS_PASSWORD" not in env, workload
            pod = find(docs, "DaemonSet", workload)["spec"]["template"]["spec"]
            (password,) = [v for v in pod["volumes"] if v["name"] == "nats-password"]
            assert password["hostPath"] == {"path": f"/var/lib/gpushare/nats-leaf/users/{role}", "type": "File"}


def test_the_leaf_connects_to_every_server_with_its_token(rendered: dict[str, list[dict[str, Any]]]) -> None:
    hubs = ",".join(f"nats-leaf://gpushare-nats-{i}.gpushare-nats-headless.{NAMESPACE}.svc.cluster.local:7422"
                    for i in range(3))  # fmt: skip
    for command in leaf_args(rendered["defaults"]):
        assert command[command.index("--hub") + 1] == hubs
        assert command[command.index("--token-file") + 1] == "/var/run/secrets/gpushare/nats/token"
    config, agent = leaf_args(rendered["external NATS"])
    assert agent[agent.index("--hub") + 1] == config[config.index("--hub") + 1]
    assert config[config.index("--hub") + 1] == "nats-leaf://a.example:7422,nats-leaf://b.example:7422"
    pod = find(rendered["defaults"], "DaemonSet", "gpushare-nats-leaf")["spec"]["template"]["spec"]
    assert pod["hostNetwork"] and pod["serviceAccountName"] == "gpushare-leaf"
    (token,) = [v for v in pod["volumes"] if v["name"] == "nats-token"]
    assert token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == "gpushare-nats"
    (state,) = [v for v in pod["volumes"] if v["name"] == "state"]
    assert state["hostPath"] == {"path": "/var/lib/gpushare/nats-leaf", "type": "DirectoryOrCreate"}
    assert "leafnodes {\n  port: 7422\n}" in find(rendered["defaults"], "ConfigMap", "nats-config")["data"]["nats.conf"]
    roles = service_env(rendered["defaults"], "gpushare-nats-auth")["GPUSHARE_AUTH_ROLES"]
    assert roles == f"{NAMESPACE}/gpushare-leaf=leaf,{NAMESPACE}/gpushare-console=observer"


def test_one_nats_replica_is_a_single_server(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["1 NATS replica"]
    (nats,) = find(docs, "StatefulSet", "gpushare-nats")["spec"]["template"]["spec"]["containers"]
    assert nats["args"] == ["-c", "/etc/nats/nats.conf"] and "env" not in nats
    assert "cluster.conf" not in find(docs, "ConfigMap", "nats-config")["data"]
    assert not [d for d in docs if d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"] == "gpushare-nats"]


def test_two_nats_replicas_are_refused() -> None:
    with pytest.raises(RenderError, match=r"nats\.replicas: 1, or 3 or more"):
        render({"nats": {"replicas": 2}})


def test_external_nats(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["external NATS"]
    servers = ("gpushare-nats", "gpushare-nats-headless", "nats-config")
    assert not [d for d in docs if d["metadata"]["name"] in servers or d["kind"] == "Secret"]
    callout = service_env(docs, "gpushare-nats-auth")  # the external servers call it out too
    assert callout["GPUSHARE_NATS_URL"] == "nats://a.example:4222,nats://b.example:4222"
    assert callout["GPUSHARE_NATS_PASSWORD"]["secretKeyRef"]["name"] == "my-nats"
    (volume,) = find(docs, "Deployment", "gpushare-nats-auth")["spec"]["template"]["spec"]["volumes"]
    assert volume["secret"]["secretName"] == "my-issuer"
    secrets = {"existingSecret": "x", "existingIssuerSecret": "y"}
    with pytest.raises(RenderError, match=r"needs nats\.external\.urls"):
        render({"nats": {"enabled": False, "auth": secrets, "external": {"leafUrls": ["x"]}}})
    with pytest.raises(RenderError, match=r"needs nats\.external\.leafUrls"):
        render({"nats": {"enabled": False, "auth": secrets, "external": {"urls": ["x"]}}})
    with pytest.raises(RenderError, match=r"needs nats\.auth\.existingSecret"):
        render({"nats": {"enabled": False, "external": {"urls": ["nats://a:4222"]}}})


def test_generated_nats_secret_has_every_password(rendered: dict[str, list[dict[str, Any]]]) -> None:
    secret = find(rendered["defaults"], "Secret", "nats-users")
    keys = {"AUTH_PASSWORD", "INSTALLER_PASSWORD", "ROUTE_PASSWORD"}  # the static users and the routes
    assert set(secret["data"]) == keys and len(set(secret["data"].values())) == len(keys)
    issuer = find(rendered["defaults"], "Secret", "nats-auth-issuer")
    assert set(issuer["data"]) == {"issuer"} and len(base64.b64decode(issuer["data"]["issuer"])) >= 32
    gen = (chart.K8S / "gen-secrets.sh").read_text()
    assert all(k.removesuffix("_PASSWORD") in gen for k in keys) and "nats-auth-issuer" in gen


def test_kernel_module_switch(rendered: dict[str, list[dict[str, Any]]]) -> None:
    off = find(rendered["defaults"], "DaemonSet", "gpushare-kmod-bridge")["spec"]["template"]["spec"]
    on = find(rendered["kmod on"], "DaemonSet", "gpushare-kmod-bridge")["spec"]["template"]["spec"]
    assert "initContainers" not in off
    (installer,) = on["initContainers"]
    assert installer["image"] == "gpushare/kmod-installer:0.1.0" and installer["securityContext"]["privileged"]
    assert {v["name"] for v in on["volumes"]} - {v["name"] for v in off["volumes"]} == {"modules", "usr-src",
                                                                                      "sys-module"}


def test_overselling_switch(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert service_env(rendered["defaults"], "gpushare-deviceplugin")["GPUSHARE_DP_CAPACITY_RESOURCES"] == "vcpu,vmem"
    assert service_env(rendered["overselling off"], "gpushare-deviceplugin")["GPUSHARE_DP_CAPACITY_RESOURCES"] == ""


def test_console_switch(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert not [d for d in rendered["defaults"] if "console" in d["metadata"]["name"]]
    docs = rendered["console on"]
    deployment = find(docs, "Deployment", "gpushare-console")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "gpushare/console:0.1.0" and container["ports"] == [
        {"name": "http", "containerPort": 8080}]
    assert find(docs, "Service", "gpushare-console")["spec"]["ports"][0]["port"] == 8080
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "gpushare-console"
    find(docs, "ServiceAccount", "gpushare-console")
    rules = find(docs, "ClusterRole", "gpushare-console")["rules"]
    assert {v for r in rules for v in r["verbs"]} == {"get", "list", "watch"}
    assert find(docs, "ClusterRoleBinding", "gpushare-console")["subjects"][0]["name"] == "gpushare-console"


def test_device_plugins_switch_and_dra_switch(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["device plugins off, dra on"]
    assert not [d for d in docs if "deviceplugin" in d["metadata"]["name"]]
    defaults = {(d["kind"], d["metadata"]["name"]) for d in rendered["defaults"]}
    added = {(d["kind"], d["metadata"]["name"]) for d in docs} - defaults
    assert {name for kind, name in added if kind == "DeviceClass"} == {
        "share.gpushare.k8s.io", "exclusive.gpushare.k8s.io", "spot.gpushare.k8s.io"}
    assert ("DaemonSet", "gpushare-dra-driver") in added  # tests/dra/test_chart_dra.py has the rest
    assert not [d for d in rendered["defaults"] if d["apiVersion"].startswith("resource.k8s.io/")]


@pytest.mark.parametrize("value_set", ["defaults", "kmod on", "console on", "device plugins off, dra on"])
def test_notes_say_what_the_chart_renders(rendered: dict[str, list[dict[str, Any]]], value_set: str) -> None:
    """NOTES.txt names exactly the parts that render, the DRA node label the driver's DaemonSet
    selects, and the console's Service as it renders."""
    docs, text = rendered[value_set], chart.notes(VALUE_SETS[value_set])
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    installed = text.split("Installed: ", 1)[1].split("\n", 1)[0]
    assert ("device plugins" in installed) == (("DaemonSet", "gpushare-deviceplugin") in names)
    assert ("DRA driver" in installed) == (("DaemonSet", "gpushare-dra-driver") in names)
    assert ("console" in installed) == (("Deployment", "gpushare-console") in names)
    kmod = find(docs, "DaemonSet", "gpushare-kmod-bridge")["spec"]["template"]["spec"]
    assert ("kernel module" in installed) == ("initContainers" in kmod)
    assert ("kernelModule.enabled=false" in text) == ("initContainers" not in kmod)
    if ("DaemonSet", "gpushare-dra-driver") in names:
        affinity = find(docs, "DaemonSet", "gpushare-dra-driver")["spec"]["template"]["spec"]["affinity"]
        (term,) = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        (label,) = term["matchExpressions"]
        assert f"kubectl label node <node> {label['key']}=true" in text
    if ("Deployment", "gpushare-console") in names:
        port = find(docs, "Service", "gpushare-console")["spec"]["ports"][0]["port"]
        assert f"port-forward service/gpushare-console {port}:{port}" in text
    assert "does not exist yet" not in text


def test_mps_caps_without_the_cards_memory_are_refused() -> None:
    """An MPS share's memory limit is card memory * k / N: without the card's memory helm
    template fails, saying which value to set."""
    with pytest.raises(RenderError, match=r"vendor\.cardMemoryMiB has no entry for nvidia\.com/gpu"):
        render({"shadow": {"mps": {"kinds": ["share"]}}})
    docs = render({"shadow": {"mps": {"kinds": ["share"]}}, "vendor": {"cardMemoryMiB": {"nvidia.com/gpu": 81920}}})
    assert service_env(docs, "gpushare-deviceplugin")["GPUSHARE_DP_CARD_MEMORY_MIB"] == "nvidia.com/gpu=81920"


def test_make_images_builds_and_pushes_every_image_the_chart_deploys() -> None:
    """``make images`` / ``make push-images`` with a registry and tag: every image the chart renders
    with every part on (DRA, console, kernel module), named as the chart names it there, built from
    the Dockerfile whose build line makes it."""
    values = {"images": {"registry": "registry.example.com/", "tag": "9.9"}, "dra": {"enabled": True},
              "console": {"enabled": True}, "kernelModule": {"enabled": True}}
    deployed = {c["image"] for d in render(values) if d["kind"] in ("DaemonSet", "Deployment", "StatefulSet")
                for c in containers(d) if "/gpushare/" in c["image"]}  # fmt: skip
    dry = subprocess.run(["make", "-n", "push-images", "REGISTRY=registry.example.com/", "TAG=9.9"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    built = dict((image, path) for path, image in re.findall(r"docker build -f (\S+) -t (\S+) \.", dry))
    pushed = set(re.findall(r"docker push (\S+)", dry))
    assert deployed == set(built) == pushed
    for image, path in built.items():
        name = image.removeprefix("registry.example.com/").split(":")[0]
        assert f"docker build -f {path} -t {name}:" in (ROOT / path).read_text(), (path, name)


def test_images_come_from_the_registry(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["registry and pull secret"]
    images = {c["image"] for d in docs if d["kind"] in ("DaemonSet", "Deployment") for c in containers(d)}
    assert "registry.example.com/gpushare/solver:1.2.3" in images
    assert {i for i in images if "gpushare/" in i and not i.startswith("registry.example.com/")} == set()
    for doc in docs:
        if doc["kind"] in ("DaemonSet", "Deployment", "StatefulSet"):
            assert doc["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}], doc["metadata"]


def test_shadow_namespace(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["shadow namespace"]
    find(docs, "Namespace", "gpushare-shadow")
    assert find(docs, "Role", "gpushare-shadow-controller-shadowpods")["metadata"]["namespace"] == "gpushare-shadow"
    policy = find(docs, "ValidatingAdmissionPolicy", "gpushare-shadowpod-template")
    assert "request.namespace == 'gpushare-shadow'" in policy["spec"]["validations"][0]["expression"]
    selector = find(docs, "ValidatingAdmissionPolicy", "gpushare-system-namespace-pods")["spec"]["matchConstraints"]
    assert selector["namespaceSelector"]["matchExpressions"][0]["values"] == [NAMESPACE, "gpushare-shadow"]


def test_admission_switch(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert not [d for d in rendered["no admission policies"] if d["kind"].startswith("ValidatingAdmission")]


# --- k8s/base is the chart ---------------------------------------------------------------------------


def test_base_and_kmod_component_are_the_charts_rendering() -> None:
    assert chart.differences() == [], "run `make manifests`"


def test_a_stale_base_file_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path / "base"
    shutil.copytree(chart.BASE, base)
    solver = base / "solver.yaml"
    solver.write_text(solver.read_text().replace("containerPort: 8082", "containerPort: 1"))
    (base / "old.yaml").write_text("kind: x\n")
    monkeypatch.setattr(chart, "BASE", base)
    monkeypatch.setattr(chart, "ROOT", tmp_path)
    expected = {"base/old.yaml: not rendered by the chart", "base/solver.yaml: differs from the chart's rendering"}
    assert expected <= set(chart.differences())


def test_base_kustomization_lists_every_rendered_file() -> None:
    kustomization = yaml.safe_load((chart.BASE / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in chart.generated_in_base())


def kustomize(tmp_path: Path, target: str) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of a copy of k8s/ with generated NATS passwords."""
    k8s = tmp_path / "k8s"
    shutil.copytree(chart.K8S, k8s, symlinks=True, ignore=shutil.ignore_patterns("secrets"))
    shutil.copytree(ROOT / "runtime" / "install", tmp_path / "runtime" / "install")
    subprocess.run([str(k8s / "gen-secrets.sh")], check=True, capture_output=True)
    built = subprocess.run([str(tools.binary("kubectl")), "kustomize", str(k8s / target)], capture_output=True,
                           text=True, check=True)
    return [d for d in yaml.safe_load_all(built.stdout) if d]


def _by_name(docs: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """Objects by kind and name, the generated Secrets' hashed names written as the chart's."""
    hashed = {d["metadata"]["name"]: d["metadata"]["name"].rsplit("-", 1)[0] for d in docs if d["kind"] == "Secret"}
    assert sorted(hashed.values()) == ["nats-auth-issuer", "nats-users"]

    def unhashed(text: str) -> str:
        for name, plain in hashed.items():
            text = text.replace(name, plain)
        return text

    return {(d["kind"], d["metadata"]["name"]): unhashed(yaml.safe_dump(d)) for d in docs if d["kind"] != "Secret"}


def test_kustomize_builds_the_charts_objects(tmp_path: Path) -> None:
    """kubectl kustomize k8s/base gives the chart's objects, plus the NATS Secret it generates."""
    base = kustomize(tmp_path, "base")
    secrets = {d["metadata"]["name"].rsplit("-", 1)[0]: d for d in base if d["kind"] == "Secret"}
    for name, secret in secrets.items():
        assert secret["metadata"]["namespace"] == NAMESPACE
        assert set(secret["data"]) == set(find(render(), "Secret", name)["data"]), name
    expected = {(d["kind"], d["metadata"]["name"]): yaml.safe_dump(d) for d in render(base=True)}
    assert _by_name(base) == expected
    for doc in base:
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def test_kustomize_kmod_overlay_is_the_chart_with_the_module_on(tmp_path: Path) -> None:
    with_kmod = _by_name(kustomize(tmp_path, "overlays/with-kmod"))
    expected = {(d["kind"], d["metadata"]["name"]): yaml.safe_dump(d)
                for d in render({"kernelModule": {"enabled": True}}, base=True)}  # fmt: skip
    assert with_kmod == expected


def test_install_material_comes_from_the_runtime(rendered: dict[str, list[dict[str, Any]]]) -> None:
    config = find(rendered["defaults"], "ConfigMap", "gpushare-runtime")["data"]
    install = ROOT / "runtime" / "install"
    assert config["runtime.json"] == (install / "runtime.json.example").read_text()
    assert config["containerd-gpushare.toml"] == (install / "containerd-gpushare.toml").read_text()
    runtime_class = find(rendered["defaults"], "RuntimeClass", "gpushare")
    assert runtime_class == yaml.safe_load((install / "runtimeclass.yaml").read_text())


@pytest.mark.parametrize("value_set", ["defaults", "1 NATS replica", "console on"])
def test_helm_lint_finds_nothing_to_fix(value_set: str, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(VALUE_SETS[value_set]))
    result = subprocess.run([str(tools.binary("helm")), "lint", str(chart.CHART), "--strict", "--values", str(values)],
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert result.returncode == 0 and "[WARNING]" not in result.stdout, result.stdout + result.stderr
