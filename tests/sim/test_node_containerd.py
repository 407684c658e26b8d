"""The node simulator with real containers through ``ctr run`` (private containerd + runc, an OCI
spec of the node's own): a pod asking for nvidia.com/gpu: 1 runs in a runc container that sees its
fake card, carries the CRI identity and Allocate annotations, and is killed on deletion. (The CRI
path, the default: tests/sim/test_node_cri.py and the end-to-end scenarios.)"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from gpushare_common.ids import ANN_DEVICES_FROM, ANN_DEVICES_IDS, KIND_IDS, load_key, sign, signature_annotation
from gpushare_sim.kernel import KernelStandIn
from gpushare_sim.node.adapters.backend import containerd_usable, runtime_binary, signing_key
from gpushare_sim.node.app import NodeSim
from gpushare_sim.node.model import parse_pod
from gpushare_sim.node.settings import NodeSimSettings
from gpushare_sim.node.testing import pod_manifest, running_node, short_sim_dir, wait_until

from tests.sim.test_node_kubelet import GPU, TOOLS, RecordingApi, phase

pytestmark = pytest.mark.containerd


@pytest.fixture
async def node() -> AsyncIterator[tuple[NodeSim, RecordingApi]]:
    if not containerd_usable():
        pytest.skip("needs root, containerd, ctr, runc and busybox")
    if shutil.which("gcc") is None and not (TOOLS / "gpuload").exists():
        pytest.skip("needs gcc to build sim/tools/gpuload")
    sim_dir = short_sim_dir()
    settings = NodeSimSettings(name="c1", sim_dir=sim_dir, gpus=2, containerd="auto", containerd_api="ctr",
                               tools_dir=TOOLS, kmod_socket=str(sim_dir / "kmod" / "k.sock"))  # fmt: skip
    api = RecordingApi()
    try:
        async with running_node(settings) as sim:
            sim.kubelet.api = api
            await wait_until(lambda: sim.table.allocatable().get(GPU) == 2, what="2 cards")
            yield sim, api
    finally:
        shutil.rmtree(sim_dir, ignore_errors=True)


def ctr(sim: NodeSim, *args: str) -> str:
    command = [*sim.kubelet.runner._ctr, *args]  # type: ignore[attr-defined]
    return subprocess.run(command, capture_output=True, text=True, check=False).stdout


def config_of(sim: NodeSim, container_id: str) -> dict[str, Any]:
    path = sim.settings.node_dir / "containers" / container_id[:16] / "config.json"
    return dict(json.loads(path.read_text()))


async def test_gpu_pod_runs_in_runc_and_sees_its_card(node: Any) -> None:
    sim, api = node
    script = "ls -l /dev/nvidia* > /run/gpuload/devs; exec gpuload --util 60 --every-ms 100"
    manifest = pod_manifest("g", ["sh", "-c", script], node="c1", uid="uid-g",
                            resources={GPU: "1"}, annotations={"team": "a"})  # fmt: skip
    await sim.kubelet.sync([parse_pod(manifest)])
    await wait_until(lambda: phase(api, "default/g") == "Running", 30, "pod g running")
    reports = sim.settings.node_dir / "util" / "default" / "g" / "main"
    report = await wait_until(lambda: _read(reports / "nvidia0.json"), 15, "gpuload report")
    assert report["util"] == 60 and report["ioctls"] >= 1
    assert "nvidia0" in (reports / "devs").read_text()
    assert "nvidia1" not in (reports / "devs").read_text()
    container_id = sim.kubelet.workers["uid-g"].ids["main"]
    assert container_id in ctr(sim, "task", "ls", "-q")
    where = sim.status()["endpoints"]
    assert where["containerd_namespace"] == "k8s.io"
    assert (sim.settings.node_dir / "containerd.sock").resolve() == Path(where["containerd_address"])
    annotations = config_of(sim, container_id)["annotations"]
    assert annotations["io.kubernetes.cri.sandbox-namespace"] == "default"
    assert annotations["io.kubernetes.cri.sandbox-name"] == "g"
    assert annotations["io.kubernetes.cri.container-name"] == "main"
    assert annotations["team"] == "a"
    devices = config_of(sim, container_id)["linux"]["devices"]
    assert [d["path"] for d in devices] == ["/dev/nvidia0"]

    await sim.kubelet.sync([])
    await wait_until(lambda: not sim.kubelet.workers, 20, "pod g removed")
    assert container_id not in ctr(sim, "task", "ls", "-q")


async def test_two_gpu_pods_get_different_cards(node: Any) -> None:
    sim, api = node
    cmd = ["sh", "-c", "ls /dev > /run/gpuload/devs; exec sleep 300"]
    pods = [parse_pod(pod_manifest(n, cmd, node="c1", uid=f"u-{n}", resources={GPU: "1"}))
            for n in ("p", "q")]  # fmt: skip
    await sim.kubelet.sync(pods)
    for name in ("p", "q"):
        await wait_until(lambda n=name: phase(api, f"default/{n}") == "Running", 30, name)
    seen = []
    for name in ("p", "q"):
        devs = sim.settings.node_dir / "util" / "default" / name / "main" / "devs"
        text = await wait_until(lambda d=devs: _text(d), 15, f"{name} device list")
        seen.append(sorted(w for w in text.split() if w.startswith("nvidia")))
    assert sorted(seen) == [["nvidia0"], ["nvidia1"]]
    ids = [sim.kubelet.workers[f"u-{n}"].ids["main"] for n in ("p", "q")]
    devices = [config_of(sim, i)["linux"]["devices"][0] for i in ids]
    assert devices[0]["path"] != devices[1]["path"]
    for container_id in ids:  # one cgroup each: a shared one breaks the device rules
        assert config_of(sim, container_id)["linux"]["cgroupsPath"] == f"/k8s.io/{container_id}"
    await sim.kubelet.sync([])
    await wait_until(lambda: not sim.kubelet.workers, 20, "pods removed")
    assert not ctr(sim, "task", "ls", "-q").strip()


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def _text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _needs_runtime() -> None:
    if runtime_binary("auto") is None:
        pytest.skip("gpushare-runtime is not installed beside the interpreter (make venv)")


async def _devices_seen(sim: NodeSim, api: RecordingApi, pod: str, container: str) -> list[str]:
    await wait_until(lambda: phase(api, f"default/{pod}") == "Running", 30, f"{pod} running")
    devs = sim.settings.node_dir / "util" / "default" / pod / container / "devs"
    text = await wait_until(lambda: _text(devs), 15, f"{pod}/{container} device list")
    return sorted(w for w in text.split() if w.startswith("nvidia"))


LIST_DEVS = ["sh", "-c", "ls /dev > /run/gpuload/devs; exec sleep 300"]


async def test_runtime_copies_the_card_of_main_into_dind(node: Any) -> None:
    _needs_runtime()
    sim, api = node
    body = pod_manifest("dev", LIST_DEVS, node="c1", uid="u-dev", containers=["main", "dind"],
                        annotations={f"{ANN_DEVICES_FROM}dind": "_/_/main"})  # fmt: skip
    body["spec"]["containers"][1]["resources"] = {}
    body["spec"]["containers"][0]["resources"] = {"limits": {GPU: "1"}}
    await sim.kubelet.sync([parse_pod(body)])
    assert await _devices_seen(sim, api, "dev", "main") == ["nvidia0"]
    assert await _devices_seen(sim, api, "dev", "dind") == ["nvidia0"]
    await sim.kubelet.sync([])
    await wait_until(lambda: not sim.kubelet.workers, 20, "pod removed")


async def test_runtime_injects_a_signed_card_only_into_the_container_allocated_it(node: Any) -> None:
    """The annotation names the card the kubelet allocated to the pod's container: injected. The
    same signed annotation on a pod that asked for no card (a copy) fails the container's create."""
    _needs_runtime()
    sim, api = node
    key = load_key(str(signing_key(sim.settings.node_dir)))
    value = json.dumps({GPU: ["GPU-c1-0"]})
    annotations = {f"{ANN_DEVICES_IDS}main": value,
                   signature_annotation(KIND_IDS, "main"): sign(key, KIND_IDS, "c1", "main", value)}  # fmt: skip
    owner = pod_manifest("spot", LIST_DEVS, node="c1", uid="u-spot", annotations=annotations, resources={GPU: "1"})
    copy = pod_manifest("copy", LIST_DEVS, node="c1", uid="u-copy", annotations=annotations)
    await sim.kubelet.sync([parse_pod(owner), parse_pod(copy)])
    assert await _devices_seen(sim, api, "spot", "main") == ["nvidia0"]
    state = await wait_until(lambda: sim.kubelet.container("default", "copy", "main"), 20, "copy admitted")
    await wait_until(lambda: state.exit_code == 128, 30, "the copy's create refused")
    assert "device GPU-c1-0 was not allocated to container default/copy/main by the kubelet" in state.message
    await sim.kubelet.sync([])
    await wait_until(lambda: not sim.kubelet.workers, 20, "pods removed")


async def test_workload_asks_the_kernel_stand_in_from_its_own_pid_namespace(node: Any) -> None:
    sim, api = node
    sock = Path(sim.settings.kmod_socket)
    requests: list[dict[str, Any]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(json.loads(await reader.readline()))
        writer.write(b'{"blocked_ms": 3}\n')
        await writer.drain()
        writer.close()

    sock.parent.mkdir(parents=True, exist_ok=True)
    server = await asyncio.start_unix_server(serve, path=str(sock))
    try:
        body = pod_manifest("k", ["gpuload", "--once"], node="c1", uid="u-k", resources={GPU: "1"})
        await sim.kubelet.sync([parse_pod(body)])
        await wait_until(lambda: phase(api, "default/k") == "Succeeded", 30, "pod k succeeded")
        assert requests and requests[0]["type"] == 0x46
        assert requests[0]["pidns"] != os.stat("/proc/self/ns/pid").st_ino
        report = _read(sim.settings.node_dir / "util" / "default" / "k" / "main" / "nvidia0.json")
        assert report is not None and report["blocked_ms"] == 3
    finally:
        server.close()
        await server.wait_closed()
        await sim.kubelet.sync([])
        await wait_until(lambda: not sim.kubelet.workers, 20, "pod removed")


async def test_owner_ioctl_is_held_by_the_kernel_stand_in_until_release(node: Any) -> None:
    sim, api = node
    hook = Path(sim.settings.kmod_socket)
    hook.parent.mkdir(parents=True, exist_ok=True)
    kernel = KernelStandIn(str(hook.parent / "cmd.sock"), str(hook), timeout_ms=60_000)
    await kernel.start()
    try:
        body = pod_manifest("own", ["gpuload", "--util", "10", "--every-ms", "50"], node="c1",
                            uid="u-own", resources={GPU: "1"})  # fmt: skip
        await sim.kubelet.sync([parse_pod(body)])
        await wait_until(lambda: phase(api, "default/own") == "Running", 30, "owner running")
        workdir = sim.settings.node_dir / "containers" / sim.kubelet.workers["u-own"].ids["main"][:16]
        pid = int((await wait_until(lambda: _text(workdir / "pid"), 10, "task pid")).strip())
        pidns = os.stat(f"/proc/{pid}/ns/pid").st_ino
        assert kernel.state.add(pidns, pid, detect=True) == 0
        entry = kernel.state.entries[pidns]
        await wait_until(lambda: entry.blocked == 1, 10, "the owner's ioctl held")
        assert entry.notices == 1
        kernel.state.release(pidns)
        report = sim.settings.node_dir / "util" / "default" / "own" / "main" / "nvidia0.json"
        held = await wait_until(lambda: (_read(report) or {}).get("blocked_ms", 0), 10, "resumed")
        assert held > 0 and entry.blocked == 0
    finally:
        await sim.kubelet.sync([])
        await wait_until(lambda: not sim.kubelet.workers, 20, "pod removed")
        await kernel.close()
