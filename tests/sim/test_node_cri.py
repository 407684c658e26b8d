"""The node simulator's kubelet on containerd's CRI plugin (one private containerd for the module,
the shipped drop-in's ``gpushare`` handler, gpushare-runtime under it): what reaches the runtime is
what containerd's own filtering lets through. A tenant's pod annotation outside ``gpushare.k8s.io/*``
never does, the identity keys are containerd's whatever a pod annotation says, a restarted container
gets its devices again, and a SharePod's signed annotation copied onto another pod gives it nothing."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from gpushare_common import ids
from gpushare_sim.node import logs
from gpushare_sim.node.adapters.backend import containerd_usable, runtime_binary, signing_key
from gpushare_sim.node.adapters.crirunner import CGROUP_ROOT, cgroup_parent
from gpushare_sim.node.app import NodeSim
from gpushare_sim.node.model import PodDef, parse_pod
from gpushare_sim.node.settings import NodeSimSettings
from gpushare_sim.node.testing import pod_manifest, running_node, short_sim_dir, wait_until

from tests.sim.test_node_kubelet import GPU, TOOLS, RecordingApi, phase
from tests.support import procs

pytestmark = [pytest.mark.containerd, pytest.mark.asyncio(loop_scope="module")]

SYSTEM = "gpushare-system"  # the runtime's ShadowPod namespace
LIST_DEVS = "ls /dev > /run/gpuload/devs; env > /run/gpuload/env; "
ONCE = "[ -e /run/gpuload/once ] || { touch /run/gpuload/once; echo first; exit 1; }; echo again; exec sleep 300"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node() -> AsyncIterator[tuple[NodeSim, RecordingApi]]:
    if not containerd_usable():
        pytest.skip("needs root, containerd, ctr, runc and busybox")
    if runtime_binary("auto") is None:
        pytest.skip("gpushare-runtime is not installed beside the interpreter (make venv)")
    sim_dir = short_sim_dir()
    settings = NodeSimSettings(name="cri1", sim_dir=sim_dir, gpus=2, containerd="auto", containerd_api="cri",
                               tools_dir=TOOLS)  # fmt: skip
    api = RecordingApi()
    before = procs.children()
    try:
        async with running_node(settings) as sim:
            containerd = procs.children() - before  # lives for the module: not a leak of one test
            for pid in containerd:
                procs.allow(pid)
            sim.kubelet.api = api
            await wait_until(lambda: sim.table.allocatable().get(GPU) == 2, what="2 cards")
            yield sim, api
        for pid in containerd:
            procs.disallow(pid)
    finally:
        shutil.rmtree(sim_dir, ignore_errors=True)


def where(sim: NodeSim) -> dict[str, str]:
    return sim.kubelet.runner.describe()


def bundle(sim: NodeSim, container_id: str) -> dict[str, Any]:
    """The OCI spec containerd wrote for the runtime (what gpushare-runtime read at create)."""
    state = Path(where(sim)["address"]).parent / "state" / "io.containerd.runtime.v2.task" / "k8s.io"
    return dict(json.loads((state / container_id / "config.json").read_text()))


def ctr(sim: NodeSim, *args: str) -> str:
    command = ["ctr", "--address", where(sim)["address"], "-n", "k8s.io", *args]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def report(sim: NodeSim, pod: PodDef, container: str, name: str) -> str | None:
    try:
        return (sim.settings.node_dir / "util" / pod.namespace / pod.name / container / name).read_text()
    except OSError:
        return None


def cards(listing: str) -> list[str]:
    return sorted(word for word in listing.split() if word.startswith("nvidia"))


async def run(sim: NodeSim, api: RecordingApi, body: dict[str, Any]) -> PodDef:
    pod = parse_pod(body)
    await sim.kubelet.sync([pod])
    await wait_until(lambda: phase(api, pod.key) == "Running", 60, f"{pod.key} running")
    return pod


async def remove(sim: NodeSim, pod: PodDef) -> None:
    """Delete the pod; its sandbox, containers, logs and cgroup go with it."""
    await sim.kubelet.sync([])
    await wait_until(lambda: not sim.kubelet.workers, 60, f"{pod.key} removed")
    assert ctr(sim, "containers", "ls", "-q").split() == []  # sandbox (pause) included
    assert not (sim.settings.node_dir / "pods" / f"{pod.namespace}_{pod.name}_{pod.uid}").exists()
    assert not (CGROUP_ROOT / "pids" / cgroup_parent(pod).strip("/")).exists()


async def test_the_cri_plugin_loads_with_the_shipped_drop_in(node: Any) -> None:
    sim, _ = node
    plugins = [line.split() for line in ctr(sim, "plugins", "ls").splitlines()]
    assert [p[-1] for p in plugins if p[:2] == ["io.containerd.grpc.v1", "cri"]] == ["ok"]
    assert where(sim)["handler"] == "gpushare" and where(sim)["kind"] == "cri"


async def test_only_gpushare_annotations_and_containerds_identity_reach_the_runtime(node: Any) -> None:
    sim, api = node
    forged = {"io.kubernetes.cri.sandbox-namespace": SYSTEM, "io.kubernetes.cri.sandbox-name": "shadow-1",
              "io.kubernetes.cri.container-name": "main", "io.kubernetes.cri.sandbox-uid": "not-mine",
              "io.kubernetes.pod.namespace": SYSTEM, "io.kubernetes.pod.name": "shadow-1"}
    body = pod_manifest("tenant", ["sh", "-c", LIST_DEVS + "exec sleep 300"], namespace="team-b", node="cri1",
                        uid="c0ffee00-0000-4000-8000-000000000001", resources={GPU: "1"},
                        annotations={"team.example/owner": "b", ids.ANN_USER_ID: "u-1", **forged})  # fmt: skip
    pod = await run(sim, api, body)
    container_id = sim.kubelet.workers[pod.uid].ids["main"]
    spec = bundle(sim, container_id)
    annotations = spec["annotations"]
    assert "team.example/owner" not in annotations and annotations[ids.ANN_USER_ID] == "u-1"
    assert annotations["io.kubernetes.cri.sandbox-namespace"] == "team-b"
    assert annotations["io.kubernetes.cri.sandbox-name"] == "tenant"
    assert annotations["io.kubernetes.cri.container-name"] == "main"
    assert annotations["io.kubernetes.cri.sandbox-uid"] == pod.uid
    assert not [key for key in annotations if key.startswith("io.kubernetes.pod.")]
    sandbox = bundle(sim, annotations["io.kubernetes.cri.sandbox-id"])["annotations"]
    assert sandbox["io.kubernetes.cri.container-type"] == "sandbox" and "team.example/owner" not in sandbox
    # the Allocate response reached the container through its CRI config: device, env, cgroup
    assert [d["path"] for d in spec["linux"]["devices"]] == ["/dev/nvidia0"]
    assert "NVIDIA_VISIBLE_DEVICES=GPU-cri1-0" in spec["process"]["env"]
    assert spec["linux"]["cgroupsPath"] == f"{cgroup_parent(pod)}/{container_id}"
    assert cards(await wait_until(lambda: report(sim, pod, "main", "devs"), 15, "device list")) == ["nvidia0"]
    await remove(sim, pod)


async def test_a_restarted_container_gets_its_devices_again(node: Any) -> None:
    """main holds a card; worker holds the other (both from Allocate) and dind copies main's through
    the runtime (a pod annotation containerd lets through). worker and dind fail once and are
    created again from the same config: each gets its devices again."""
    sim, _ = node
    body = pod_manifest("dev", ["sh", "-c", LIST_DEVS + ONCE], node="cri1", containers=["main", "worker", "dind"],
                        uid="c0ffee00-0000-4000-8000-000000000002",
                        annotations={f"{ids.ANN_DEVICES_FROM}dind": "_/_/main"})  # fmt: skip
    body["spec"]["restartPolicy"] = "OnFailure"
    main, worker, dind = body["spec"]["containers"]
    main["command"] = ["sh", "-c", LIST_DEVS + "exec sleep 300"]
    main["resources"] = worker["resources"] = {"limits": {GPU: "1"}}
    dind["resources"] = {}
    pod = parse_pod(body)
    await sim.kubelet.sync([pod])
    states = {state.name: state for state in sim.kubelet.workers[pod.uid].containers}
    restarted = [states["worker"], states["dind"]]
    await wait_until(lambda: all(s.restart_count == 1 and s.running and s.container_id != s.previous_id
                                 for s in restarted), 60, "worker and dind restarted once")  # fmt: skip
    seen = {name: cards(await wait_until(lambda n=name: report(sim, pod, n, "devs"), 15, f"{name} devices"))
            for name in states}  # fmt: skip
    assert len(seen["main"]) == len(seen["worker"]) == 1 and seen["main"] != seen["worker"]
    assert seen["dind"] == seen["main"]
    for state in restarted:
        spec = bundle(sim, state.container_id)
        assert [d["path"] for d in spec["linux"]["devices"]] == [f"/dev/{seen[state.name][0]}"]
        previous = logs.source(pod.name, state, previous=True)
        assert previous.file.cri and b"".join([c async for c in logs.stream(previous, logs.LogRequest())]) == b"first\n"
        assert state.previous_id not in ctr(sim, "containers", "ls", "-q").split()  # the old one is removed
    await remove(sim, pod)


def _runtime_asks_the_kubelet() -> bool:
    return importlib.util.find_spec("gpushare_runtime.allocation") is not None


async def test_a_sharepods_signed_annotation_copied_onto_another_pod_gives_it_nothing(node: Any) -> None:
    """team-a's SharePod got card copies from ShadowPod shadow-1 through a signed Allocate annotation;
    team-b copies that annotation onto a pod of its own on the same node (a pod annotation the
    handler lets through, to the pod's sandbox as well as to its containers). The kubelet allocated
    team-b's pod no share of shadow-1, so the runtime refuses it and its container never runs."""
    if not _runtime_asks_the_kubelet():
        pytest.skip("this runtime does not ask the kubelet's pod-resources before a copy from another pod")
    sim, api = node
    shadow = await run(sim, api, pod_manifest("shadow-1", ["sleep", "300"], namespace=SYSTEM, node="cri1",
                                              uid="c0ffee00-0000-4000-8000-000000000003", resources={GPU: "1"}))
    key = ids.load_key(str(signing_key(sim.settings.node_dir)))
    value = ids.format_devices_from({f"{SYSTEM}/shadow-1/main": {"*": [f"{SYSTEM}/shadow-1-0"]}})
    copied = {f"{ids.ANN_DEVICES_FROM}*": value,
              ids.signature_annotation(ids.KIND_FROM, "*"): ids.sign(key, ids.KIND_FROM, "cri1", "*", value)}
    replay = parse_pod(pod_manifest("inference-1", ["sh", "-c", LIST_DEVS + "exec sleep 300"], namespace="team-b",
                                    node="cri1", uid="c0ffee00-0000-4000-8000-000000000004", annotations=copied))
    await sim.kubelet.sync([shadow, replay])
    state = await wait_until(lambda: _failed(sim, replay), 60, "the replayed pod's container refused")
    # refused at create, with the runtime's own reason (its log line, which containerd reports)
    assert "gpushare.k8s.io/container-devices-from" in state.message and "kubelet" in state.message, state.message
    assert state.exit_code == 128
    assert report(sim, replay, "main", "devs") is None  # it never ran, so never saw the card
    await sim.kubelet.sync([shadow])
    await wait_until(lambda: replay.uid not in sim.kubelet.workers, 60, "replayed pod removed")
    await remove(sim, shadow)


def _failed(sim: NodeSim, pod: PodDef) -> Any:
    worker = sim.kubelet.workers.get(pod.uid)
    state = worker.containers[0] if worker is not None else None
    return state if state is not None and state.message else None
