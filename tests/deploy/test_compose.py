"""compose/docker-compose.yaml and the k8s/base workloads give each service only settings it has.

The valid variable names of a service are derived from its code: the variables its settings
struct reads (:func:`gpushare_common.settings.variables`, what its ``--help`` lists). Checked too:
images come from Dockerfiles in the repository, health checks and published ports use the
port the service listens on, named volumes, bind-mount sources, ``${VAR}`` interpolations
and profiles exist, and every path setting a service uses lies inside something mounted.
Each check is also run on a broken copy, which must fail with a message naming the fault.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpushare_common.ports import port_of
from gpushare_common.settings import variables
from gpushare_nats_auth.natsconf import static_users
from gpushare_sim.run.procs import wait_ports
from gpushare_sim.shorttmp import short_mkdtemp

from tests.support.service import http_env, http_port

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "compose"
COMPOSE = COMPOSE_DIR / "docker-compose.yaml"
ENV_EXAMPLE = COMPOSE_DIR / ".env.example"
K8S_BASE = ROOT / "k8s" / "base"
K8S_KMOD_PATCH = ROOT / "k8s" / "components" / "kmod" / "kmod-bridge.yaml"
IMAGE = re.compile(r"(gpushare/[\w-]+):([\w.-]+)")
SERVICES = ("detector", "solver", "deviceplugin", "kmod-bridge", "shadow-controller")
ALL_SERVICES = (*SERVICES, "nats-auth", "console", "dra-driver")
COMPOSE_SERVICES = (*SERVICES, "console")  # in every profile of compose
PROFILES = ("sim", "node")
SIM_DOCKERFILE = "compose/sim.Dockerfile"
VERSION = "0.1.0"
HEALTH_URL = re.compile(r"http://127\.0\.0\.1:(\d+)/healthz")
PATH_FIELD = re.compile(r"(socket|file|dir|address|root|kubeconfig)$")
ALWAYS_PRESENT = ("/proc",)  # every container has its own; hostPID / pid: host makes it the node's
# path settings that a configuration does not use: variable -> (switch, value that uses it)
USED_ONLY_WHEN = {
    "GPUSHARE_KMOD_SIM_SOCKET": ("GPUSHARE_KMOD_TRANSPORT", "sim"),
    "GPUSHARE_KMOD_CONTAINERD_ADDRESS": ("GPUSHARE_KMOD_SOURCES", "containerd"),
}
# the simulated node runs its containers as plain processes: there is no containerd to reach
NO_CONTAINERD = {("sim-solver", "GPUSHARE_SOLVER_CONTAINERD_ADDRESS")}


# --- what the code reads ---------------------------------------------------------------------


def package_dir(service: str) -> Path:
    return ROOT / "services" / service / f"gpushare_{service.replace('-', '_')}"


def service_settings(service: str) -> type:
    """The service's settings struct (everything it reads, and its ``DEFAULT_PORT``)."""
    module = importlib.import_module(f"gpushare_{service.replace('-', '_')}.settings")
    return module.Settings  # type: ignore[no-any-return]


@cache
def settings_of(service: str) -> dict[str, Any]:
    """Every variable the service reads -> its default, as its ``--help`` lists them."""
    return {v.name: v.default for v in variables(service_settings(service))}


@cache
def image_port(service: str) -> int:
    """The HTTP port the service's image sets (``ENV ... GPUSHARE_HTTP_PORT=N``)."""
    text = (ROOT / "services" / service / "Dockerfile").read_text()
    match = re.search(r"^ENV .*\bGPUSHARE_HTTP_PORT=(\d+)", text, re.M)
    assert match, f"services/{service}/Dockerfile sets no GPUSHARE_HTTP_PORT"
    return int(match.group(1))


def listen_port(service: str, env: dict[str, str]) -> int:
    return int(env.get("GPUSHARE_HTTP_PORT", image_port(service)))


def unmounted_paths(where: str, service: str, env: dict[str, str], mounts: list[str]) -> list[str]:
    """Path settings in use whose (effective) value lies in nothing mounted."""
    errors = []
    for variable, default in settings_of(service).items():
        value = env.get(variable, default)
        if not PATH_FIELD.search(variable.lower()) or not isinstance(value, str) or not value.startswith("/"):
            continue
        switch = USED_ONLY_WHEN.get(variable)
        if switch and switch[1] not in env.get(switch[0], str(settings_of(service).get(switch[0]))):
            continue
        if (where, variable) in NO_CONTAINERD or value.startswith(ALWAYS_PRESENT):
            continue
        if not any(value == m or value.startswith(m.rstrip("/") + "/") for m in mounts):
            errors.append(f"{where}: {variable}={value} is not inside any mount ({', '.join(mounts) or 'none'})")
    return errors


def unknown_variables(where: str, service: str, names: list[str]) -> list[str]:
    valid = settings_of(service)
    return [f"{where}: {name} is not a setting of {service}" for name in names if name not in valid]


# --- compose -------------------------------------------------------------------------------


def _service_of(spec: dict[str, Any]) -> str | None:
    dockerfile = (spec.get("build") or {}).get("dockerfile", "")
    match = re.fullmatch(r"services/([\w-]+)/Dockerfile", dockerfile)
    return match.group(1) if match else None


def _environment(spec: dict[str, Any]) -> dict[str, str]:
    env = spec.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _mounts(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of each short-syntax volume."""
    result = []
    for volume in spec.get("volumes") or []:
        head = volume.index("}") + 1 if volume.startswith("${") else 0  # ${VAR:-default} may hold ':'
        source, _, rest = volume[head:].partition(":")
        result.append((volume[:head] + source, rest.split(":")[0]))
    return result


def _image_errors(name: str, spec: dict[str, Any], images: set[str]) -> list[str]:
    build = spec.get("build")
    if build is None:
        return [] if spec.get("image") in images else [f"{name}: image {spec.get('image')} has no Dockerfile "
                                                         f"here and no k8s manifest uses it"]  # fmt: skip
    dockerfile = COMPOSE_DIR / build["context"] / build["dockerfile"]
    service = _service_of(spec) or "sim"
    errors = [] if dockerfile.is_file() else [f"{name}: no Dockerfile {build['dockerfile']}"]
    if spec.get("image") != f"gpushare/{service}:{VERSION}":
        errors.append(f"{name}: image {spec.get('image')} is not gpushare/{service}:{VERSION}")
    return errors


def _port_errors(name: str, spec: dict[str, Any], port: int, others: tuple[int, ...] = ()) -> list[str]:
    test = " ".join(map(str, spec.get("healthcheck", {}).get("test", [])))
    health = HEALTH_URL.search(test)
    errors = []
    if health is None or int(health.group(1)) != port:
        errors.append(f"{name}: healthcheck {test!r} does not ask /healthz on port {port}")
    for published in spec.get("ports") or []:
        if int(str(published).rsplit(":", 1)[-1]) not in (port, *others):
            errors.append(f"{name}: publishes {published} but listens on {port}")
    return errors


def _volume_errors(name: str, spec: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    errors = []
    for source, _ in _mounts(spec):
        if source.startswith("."):
            if not (COMPOSE_DIR / source).exists():
                errors.append(f"{name}: bind source {source} does not exist")
        elif not source.startswith(("/", "$", "~")) and source not in (doc.get("volumes") or {}):
            errors.append(f"{name}: volume {source} is not declared")
    return errors


def _dependency_errors(name: str, spec: dict[str, Any], services: dict[str, Any]) -> list[str]:
    errors = []
    for profile in spec.get("profiles") or []:
        if profile not in PROFILES:
            errors.append(f"{name}: unknown profile {profile}")
    for other in spec.get("depends_on") or {}:
        if other not in services:
            errors.append(f"{name}: depends on {other}, which does not exist")
        elif not set(services[other].get("profiles") or PROFILES) >= set(spec.get("profiles") or PROFILES):
            errors.append(f"{name}: depends on {other}, which is not in the same profiles")
    return errors


def _gpushare_errors(name: str, service: str, spec: dict[str, Any]) -> list[str]:
    env = _environment(spec)
    errors = unknown_variables(name, service, list(env))
    errors += _port_errors(name, spec, listen_port(service, env))
    errors += unmounted_paths(name, service, env, [target for _, target in _mounts(spec)])
    return errors


def _sim_errors(name: str, spec: dict[str, Any]) -> list[str]:
    errors = [f"{name}: the simulator reads no environment ({', '.join(_environment(spec))})"] \
        if spec.get("environment") else []  # fmt: skip
    command = " ".join(spec.get("command") or [])
    port = re.search(r"--port[ =](\d+)", command)
    others = tuple(int(p) for p in re.findall(r"--[\w-]+-port[ =](\d+)", command))
    if port is not None:
        errors += _port_errors(name, spec, int(port.group(1)), others)
    return errors


def _interpolation_errors(text: str) -> list[str]:
    defined = {line.split("=", 1)[0] for line in ENV_EXAMPLE.read_text().splitlines()
               if "=" in line and not line.startswith("#")}  # fmt: skip
    used = set(re.findall(r"\$\{([A-Za-z_]\w*)", text))
    return [f"${{{v}}} is not defined in compose/.env.example" for v in sorted(used - defined)]


def _unused_variable_errors(text: str) -> list[str]:
    """Variables of compose/.env.example that nothing reads: neither compose's interpolations nor
    the NATS users' block nats-server reads them in (its passwords)."""
    defined = [line.split("=", 1)[0] for line in ENV_EXAMPLE.read_text().splitlines()
               if "=" in line and not line.startswith("#")]  # fmt: skip
    used = set(re.findall(r"\$\{([A-Za-z_]\w*)", text)) | set(re.findall(r"\$([A-Z_]+)", static_users("node")))
    return [f"{v} in compose/.env.example is used by nothing" for v in defined if v not in used]


def compose_errors(text: str) -> list[str]:
    doc = yaml.safe_load(text)
    services: dict[str, Any] = doc["services"]
    images = {c["image"] for d in k8s_docs() for c in containers(d)}
    errors = _interpolation_errors(text)
    profiles: dict[str, set[str]] = {p: set() for p in PROFILES}
    for name, spec in services.items():
        errors += _image_errors(name, spec, images) + _volume_errors(name, spec, doc)
        errors += _dependency_errors(name, spec, services)
        service = _service_of(spec)
        if service in COMPOSE_SERVICES:
            errors += _gpushare_errors(name, service, spec)
            for profile in set(spec.get("profiles") or PROFILES) & profiles.keys():
                profiles[profile].add(service)
        elif (spec.get("build") or {}).get("dockerfile") == SIM_DOCKERFILE:
            errors += _sim_errors(name, spec)
    for profile, present in profiles.items():
        errors += [f"profile {profile} lacks {s}" for s in COMPOSE_SERVICES if s not in present]
    return errors + _unused_variable_errors(text)


# --- k8s -------------------------------------------------------------------------------------


@cache
def _k8s_text() -> dict[str, str]:
    """k8s/base (rendered from the chart) and the kernel-module component's patch."""
    texts = {p.name: p.read_text() for p in sorted(K8S_BASE.glob("*.yaml")) if p.name != "kustomization.yaml"}
    return texts | {"components/kmod/kmod-bridge.yaml": K8S_KMOD_PATCH.read_text()}


def k8s_docs(texts: dict[str, str] | None = None) -> list[dict[str, Any]]:
    texts = _k8s_text() if texts is None else texts
    return [d for t in texts.values() for d in yaml.safe_load_all(t) if d]


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if doc.get("kind") not in ("DaemonSet", "Deployment", "StatefulSet"):
        return []
    spec = doc["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def _container_errors(where: str, service: str, container: dict[str, Any],
                      config_maps: dict[str, dict[str, str]]) -> list[str]:
    env_list = container.get("env") or []
    names = [e["name"] for e in env_list]
    for source in container.get("envFrom") or []:
        name = source.get("configMapRef", {}).get("name", "")
        names += list(config_maps.get(name, {}))
    values = " ".join(str(e.get("value", "")) for e in env_list)
    helpers = [n for n in names if not n.startswith("GPUSHARE_")]
    errors = [f"{where}: {n} is neither a setting nor referenced as $({n})" for n in helpers
              if f"$({n})" not in values]  # fmt: skip
    errors += unknown_variables(where, service, [n for n in names if n.startswith("GPUSHARE_")])
    env = {e["name"]: str(e.get("value", "")) for e in env_list if "value" in e}
    port = listen_port(service, env)
    http = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == "http"]
    if http != [port] or port != image_port(service):
        errors.append(f"{where}: port http {http} but the service listens on {port} (image: {image_port(service)})")
    mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
    return errors + unmounted_paths(where, service, env, mounts)


def manifest_errors(docs: list[dict[str, Any]]) -> list[str]:
    errors = []
    config_maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d.get("kind") == "ConfigMap"}
    for doc in docs:
        for container in containers(doc):
            match = IMAGE.fullmatch(container["image"])
            service = match.group(1).removeprefix("gpushare/") if match else ""
            if service in SERVICES:
                where = f"{doc['metadata']['name']}/{container['name']}"
                errors += _container_errors(where, service, container, config_maps)
    return errors


# --- tests -----------------------------------------------------------------------------------


def test_settings_are_derived_from_the_code() -> None:
    detector = settings_of("detector")
    assert detector["GPUSHARE_DETECTOR_POD_RESOURCES_SOCKET"] == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert {"GPUSHARE_NATS_URL", "GPUSHARE_NODE_NAME", "GPUSHARE_KUBE_KUBECONFIG"} <= detector.keys()
    assert "GPUSHARE_DP_SIGNING_KEY_FILE" in settings_of("deviceplugin")
    assert "GPUSHARE_SOLVER_CONTAINERD_ADDRESS" in settings_of("solver")
    shadow = settings_of("shadow-controller")
    assert "GPUSHARE_SHADOW_LEASE_NAMESPACE" in shadow and "GPUSHARE_NATS_URL" not in shadow


@pytest.mark.parametrize("service", ALL_SERVICES)
def test_image_port_is_the_code_default(service: str) -> None:
    assert image_port(service) == service_settings(service).DEFAULT_PORT  # type: ignore[attr-defined]


def test_no_two_services_default_to_one_port() -> None:
    ports = {s: service_settings(s).DEFAULT_PORT for s in ALL_SERVICES}  # type: ignore[attr-defined]
    assert len(set(ports.values())) == len(ports), ports


def test_compose_file_is_consistent() -> None:
    assert compose_errors(COMPOSE.read_text()) == []


def test_k8s_workloads_are_consistent() -> None:
    assert manifest_errors(k8s_docs()) == []


def test_every_service_is_deployed_in_k8s() -> None:
    images = {c["image"].split(":")[0] for d in k8s_docs() for c in containers(d)}
    assert {f"gpushare/{s}" for s in SERVICES} <= images


def test_every_gpushare_image_is_built_by_a_dockerfile_here() -> None:
    """Images named by k8s (base and the kernel-module component, rendered from the chart) or compose
    have a Dockerfile whose build line (``docker build -f FILE -t gpushare/NAME:TAG .``) makes that
    name and tag."""
    built: dict[str, str] = {}
    for dockerfile in ROOT.glob("**/*Dockerfile"):
        if ".venv" not in dockerfile.parts:
            for path, image in re.findall(r"docker build -f (\S+) -t (gpushare/\S+) \.", dockerfile.read_text()):
                assert ROOT / path == dockerfile, f"{dockerfile}: build line names {path}"
                built[image.split(":")[0]] = image.split(":")[1]
    named = [c["image"] for d in k8s_docs() for c in containers(d) if c["image"].startswith("gpushare/")]
    assert all(IMAGE.fullmatch(n) for n in named), "every gpushare image in k8s/ carries its tag"
    wanted = {m.group(1): m.group(2) for m in map(IMAGE.fullmatch, named) if m}
    assert "gpushare/kmod-installer" in wanted and "gpushare/node-installer" in wanted
    for spec in yaml.safe_load(COMPOSE.read_text())["services"].values():
        if spec["image"].startswith("gpushare/"):
            wanted[spec["image"].split(":")[0]] = spec["image"].split(":")[1]
    assert {name: built.get(name) for name in wanted} == wanted


def test_sim_image_puts_the_workload_program_where_the_node_simulator_looks() -> None:
    sim = importlib.import_module("gpushare_sim")
    node_settings = importlib.import_module("gpushare_sim.node.settings").NodeSimSettings
    text = (COMPOSE_DIR / "sim.Dockerfile").read_text()
    assert "pathlib.Path(gpushare_sim.__file__).parents[1] / 'tools'" in text and '"$tools/gpuload"' in text
    tools_dir = {f.name: f.default for f in dataclasses.fields(node_settings)}["tools_dir"]
    assert Path(str(sim.__file__)).parents[1] / "tools" == tools_dir


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("GPUSHARE_DP_PLUGIN_DIR:", "GPUSHARE_DP_PLUGINS_DIR:", "GPUSHARE_DP_PLUGINS_DIR is not a setting of deviceplugin"),
    ("GPUSHARE_SHADOW_IDENTITY: compose", "GPUSHARE_NATS_URL: x", "GPUSHARE_NATS_URL is not a setting of shadow"),
    ("127.0.0.1:8083/healthz", "127.0.0.1:8080/healthz", "does not ask /healthz on port 8083"),
    ('"127.0.0.1:8081:8081"', '"127.0.0.1:8081:8080"', "publishes 127.0.0.1:8081:8080"),
    ("[sim-run:/run/gpushare-sim]", "[sim-runs:/run/gpushare-sim]", "volume sim-runs is not declared"),
    ("services/solver/Dockerfile", "services/solvr/Dockerfile", "no Dockerfile services/solvr/Dockerfile"),
    ("./sim-kubeconfig.yaml:", "./kubeconfig.yaml:", "bind source ./kubeconfig.yaml does not exist"),
    ("${SOLVER_PASSWORD:?", "${SOLVER_PASS:?", "${SOLVER_PASS} is not defined"),
    ("profiles: [node]\n    pid: host  # d", "profiles: [nodes]\n    pid: host  # d", "unknown profile nodes"),
    ("/run/gpushare-sim/gpu-node-1/pod-resources/", "/run/gpushare/gpu-node-1/pod-resources/",
     "GPUSHARE_DETECTOR_POD_RESOURCES_SOCKET=/run/gpushare/gpu-node-1/pod-resources/kubelet.sock is not inside"),
    ("${EXPORTER_URL:-}", "''", "EXPORTER_URL in compose/.env.example is used by nothing"),
    ("GPUSHARE_CONSOLE_NODE_DOMAINS:", "GPUSHARE_CONSOLE_DOMAINS:",
     "GPUSHARE_CONSOLE_DOMAINS is not a setting of console"),
    ("127.0.0.1:8080/healthz", "127.0.0.1:8081/healthz", "does not ask /healthz on port 8080"),
])  # fmt: skip
def test_broken_compose_copy_fails(old: str, new: str, expected: str) -> None:
    text = COMPOSE.read_text()
    assert old in text
    errors = compose_errors(text.replace(old, new, 1))
    assert any(expected in e for e in errors), errors


@pytest.mark.parametrize(("service", "lacks"), [("sim-kmod-bridge", "profile sim lacks kmod-bridge"),
                                              ("console", "profile node lacks console")])
def test_compose_profile_without_a_service_fails(service: str, lacks: str) -> None:
    doc = yaml.safe_load(COMPOSE.read_text())
    del doc["services"][service]
    assert lacks in compose_errors(yaml.safe_dump(doc))


@pytest.mark.parametrize(("manifest", "old", "new", "expected"), [
    ("detector.yaml", "GPUSHARE_LOG_JSON", "GPUSHARE_LOG_JSONL", "GPUSHARE_LOG_JSONL is not a setting of detector"),
    ("solver.yaml", "containerPort: 8082", "containerPort: 8080", "port http [8080]"),
    ("deviceplugin.yaml", "{name: signing-key, mountPath: /etc/gpushare/signing.key, readOnly: true}",
     "{name: signing-key, mountPath: /etc/gpushare/node.key, readOnly: true}",
     "GPUSHARE_DP_SIGNING_KEY_FILE=/etc/gpushare/signing.key is not inside"),
    ("solver.yaml", 'value: "nats://$(NODE_IP):4224"', 'value: "nats://node:4224"',
     "NODE_IP is neither a setting nor referenced"),
    ("shadow-controller.yaml", "GPUSHARE_SHADOW_IMAGE:", "GPUSHARE_SHADOW_IMAGES:",
     "GPUSHARE_SHADOW_IMAGES is not a setting of shadow-controller"),
])  # fmt: skip
def test_broken_manifest_copy_fails(manifest: str, old: str, new: str, expected: str) -> None:
    texts = copy.deepcopy(_k8s_text())
    assert old in texts[manifest]
    texts[manifest] = texts[manifest].replace(old, new, 1)
    errors = manifest_errors(k8s_docs(texts))
    assert any(expected in e for e in errors), errors


def test_unused_path_settings_need_no_mount() -> None:
    env = {"GPUSHARE_KMOD_TRANSPORT": "netlink", "GPUSHARE_KMOD_SOURCES": "cgroup"}
    assert unmounted_paths("k", "kmod-bridge", env, []) == []
    env["GPUSHARE_KMOD_TRANSPORT"] = "sim"
    assert unmounted_paths("k", "kmod-bridge", env, []) == [
        "k: GPUSHARE_KMOD_SIM_SOCKET=/run/gpushare/kmod.sock is not inside any mount (none)"]


# --- the sim profile, run as local processes ---------------------------------------------------

MODULES = {s: f"gpushare_{s.replace('-', '_')}" for s in SERVICES}
NATS_PASSWORDS = {"DETECTOR_PASSWORD": "d", "SOLVER_PASSWORD": "s", "DEVICEPLUGIN_PASSWORD": "p",
                  "KMOD_BRIDGE_PASSWORD": "k", "OBSERVER_PASSWORD": "o", "INSTALLER_PASSWORD": "i"}  # fmt: skip


def local_value(value: str, run: Path, ports: dict[str, int]) -> str:
    """A compose value with the containers' names and paths replaced by this machine's; a port is
    the one its server bound here (``ports``), or 0 (any free one) for a server not started yet."""
    interpolated = re.fullmatch(r"\$\{(\w+)(:\?.*)?\}", value)
    if interpolated:
        return NATS_PASSWORDS[interpolated.group(1)]
    port = {name: str(ports.get(name, 0)) for name in ("nats", "api", "node", "exporter")}
    for old, new in (("/run/gpushare-sim", str(run)), ("/etc/gpushare/kubeconfig", f"{run}/kubeconfig"),
                     ("${NODE_NAME:-gpu-node-1}", "gpu-node-1"), ("/etc/nats/users", f"{run}/users"),
                     ("nats:4222", f"127.0.0.1:{port['nats']}"), ("sim-node:9400", f"127.0.0.1:{port['exporter']}"),
                     ("sim-apiserver:6443", f"127.0.0.1:{port['api']}"), ("/host/sys/fs/cgroup", "/sys/fs/cgroup"),
                     ("8090", port["node"]), ("9400", port["exporter"]), ("6443", port["api"]),
                     ("0.0.0.0", "127.0.0.1"), ("exec python ", f"exec {sys.executable} ")):
        value = value.replace(old, new)
    return value


def _bound(proc: subprocess.Popen[bytes], ports_dir: Path, log: Path) -> dict[str, list[str]]:
    """The ports ``proc`` bound (its ports file), or fail with its log."""
    try:
        return wait_ports(ports_dir, proc, timeout=90)
    except RuntimeError as err:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise AssertionError(f"{err}\n{tail}") from None


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as answer:
            if answer.status == 200:
                return
        time.sleep(0.1)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
    raise AssertionError(f"{proc.args!r} (exit {proc.returncode}): {url} not ready within {timeout}s\n{tail}")


GPU_POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "reserved", "namespace": "default"},
           "spec": {"containers": [{"name": "main", "image": "busybox", "command": ["gpuload", "--util", "0"],
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}  # fmt: skip
HANDLED = re.compile(r'^gpushare_bus_messages_total\{outcome="handled"\} (\S+)$', re.M)


def _create_gpu_pod(api: int) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{api}/api/v1/namespaces/default/pods", method="POST",
                                     data=json.dumps(GPU_POD).encode(), headers={"Content-Type": "application/json"})
    # the answer itself, however long a loaded machine takes to give it (services are still
    # listing and watching the emulator as they start)
    with urllib.request.urlopen(request, timeout=120) as answer:
        assert answer.status == 201


def _wait_handled(metrics_url: str, timeout: float = 60) -> None:
    """Until the service has handled a JetStream message (its bus counter), or fail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(metrics_url, timeout=2) as answer:
            handled = HANDLED.search(answer.read().decode())
        if handled and float(handled.group(1)) >= 1:
            return
        time.sleep(0.1)
    raise AssertionError(f"{metrics_url}: no event handled within {timeout}s")


def _one_shot(spec: dict[str, Any], run: Path, ports: dict[str, int], logs: Path) -> None:
    """A one-shot container's entrypoint (an installed console script) with its environment."""
    env = {k: local_value(v, run, ports) for k, v in _environment(spec).items()}
    argv = [str(Path(sys.executable).parent / spec["entrypoint"][0])]
    argv += [local_value(a, run, ports) for a in spec["entrypoint"][1:]]
    done = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=120, check=False)
    (logs / f"{Path(argv[0]).name}.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"


@pytest.mark.slow
def test_sim_profile_services_get_ready_with_the_shipped_nats_users(tmp_path: Path) -> None:
    """Every sim-profile part from its compose command and environment (names and paths mapped to
    this machine), NATS with compose/nats.conf and the users nats-config writes, the layout made by
    nats-install: each service gets ready, a GPU pod's event reaches the solver through JetStream,
    and no permission is refused."""
    if shutil.which("nats-server") is None:
        pytest.skip("nats-server is not installed (make deps installs it)")
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    ports: dict[str, int] = {}  # each server's, once it has bound it (ports files in run/ports)
    run = short_mkdtemp("gsc-")  # unix socket paths must stay short
    (bound := run / "ports").mkdir()
    conf = (COMPOSE_DIR / "nats.conf").read_text().replace("/data/jetstream", f"{run}/js")
    (run / "nats.conf").write_text(conf)
    (run / "users").mkdir()
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        argv = [sys.executable if a == "python" else local_value(a, run, ports) for a in argv]
        if "gpushare_sim.apiserver" in argv or "gpushare_sim.node" in argv:
            argv += ["--ports-dir", str(bound)]
        with (tmp_path / f"{name}.log").open("wb") as log:
            procs.append(subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=log, stderr=log))
        return procs[-1]

    try:
        _one_shot(services["nats-config"], run, ports, tmp_path)
        nats = start("nats", ["nats-server", "-c", str(run / "nats.conf"), "-a", "127.0.0.1", "-p", "-1",
                              "-m", "0", "--ports_file_dir", str(bound)], NATS_PASSWORDS)  # fmt: skip
        ports["nats"] = port_of(_bound(nats, bound, tmp_path / "nats.log")["nats"][0])
        _one_shot(services["nats-install"], run, ports, tmp_path)
        api = start("sim-apiserver", services["sim-apiserver"]["command"])
        ports["api"] = port_of(_bound(api, bound, tmp_path / "sim-apiserver.log")["api"][0])
        kubeconfig = (COMPOSE_DIR / "sim-kubeconfig.yaml").read_text()
        (run / "kubeconfig").write_text(local_value(kubeconfig, run, ports))
        start("sim-kernel", services["sim-kernel"]["command"])
        _wait_http(f"http://127.0.0.1:{ports['api']}/healthz", api, tmp_path / "sim-apiserver.log")
        node = start("sim-node", services["sim-node"]["command"])
        node_ports = _bound(node, bound, tmp_path / "sim-node.log")
        ports["node"], ports["exporter"] = port_of(node_ports["http"][0]), port_of(node_ports["exporter"][0])
        _wait_http(f"http://127.0.0.1:{ports['node']}/healthz", node, tmp_path / "sim-node.log")
        for service in SERVICES:
            env = {k: local_value(v, run, ports) for k, v in _environment(services[f"sim-{service}"]).items()}
            env |= http_env(bound)
            start(service, ["python", "-m", MODULES[service]], env)
        for service, proc in zip(SERVICES, procs[-len(SERVICES):], strict=True):
            ports[service] = http_port(bound, proc, timeout=90)
        for service, proc in zip(SERVICES, procs[-len(SERVICES):], strict=True):
            _wait_http(f"http://127.0.0.1:{ports[service]}/readyz", proc, tmp_path / f"{service}.log")
        _create_gpu_pod(ports["api"])  # detector -> JetStream -> solver (durable consumer, acks)
        _wait_handled(f"http://127.0.0.1:{ports['solver']}/metrics")
        assert [p.args for p in procs if p.poll() is not None] == []
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(run, ignore_errors=True)
    refused = [line for log in tmp_path.glob("*.log") for line in log.read_text(errors="replace").splitlines()
               if "permissions violation" in line]  # fmt: skip
    assert refused == []
