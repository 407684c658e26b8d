"""The kubelet stand-in with plain-process containers: device plugin
registration, ListAndWatch, allocation, pod-resources, deletion, restarts."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from gpushare_common.adapters.kube import Retryable
from gpushare_common.adapters.kubeletapi import podresources_v1_pb2 as pr
from gpushare_common.adapters.kubeletapi import podresources_v1_pb2_grpc as pr_grpc
from gpushare_sim.fakegpu.plugin import socket_identity
from gpushare_sim.node.adapters.runners import ProcessRunner
from gpushare_sim.node.app import NodeSim
from gpushare_sim.node.model import parse_pod
from gpushare_sim.node.settings import NodeSimSettings
from gpushare_sim.node.testing import pod_manifest, running_node, short_sim_dir, wait_until

TOOLS = Path(__file__).resolve().parents[2] / "sim" / "tools"
GPU = "nvidia.com/gpu"


class RecordingApi:
    """Records what the kubelet writes back (pod status, deletions)."""

    def __init__(self) -> None:
        self.status: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []

    async def write_pod_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.status[f"{namespace}/{name}"] = status

    async def confirm_pod_deletion(self, namespace: str, name: str) -> None:
        self.deleted.append(f"{namespace}/{name}")


@pytest.fixture
async def node() -> AsyncIterator[tuple[NodeSim, RecordingApi]]:
    sim_dir = short_sim_dir()
    settings = NodeSimSettings(name="n1", sim_dir=sim_dir, gpus=2, containerd="none")
    api = RecordingApi()
    try:
        async with running_node(settings, runner=ProcessRunner([TOOLS])) as sim:
            sim.kubelet.api = api
            await wait_until(lambda: sim.table.allocatable().get(GPU) == 2, what="2 cards")
            yield sim, api
    finally:
        shutil.rmtree(sim_dir, ignore_errors=True)


def gpu_pod(name: str, uid: str, gpus: int = 1, command: list[str] | None = None) -> Any:
    cmd = command or ["gpuload", "--util", "40", "--every-ms", "100"]
    return parse_pod(pod_manifest(name, cmd, node="n1", uid=uid, resources={GPU: str(gpus)}))


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def phase(api: RecordingApi, key: str) -> str:
    return str(api.status.get(key, {}).get("phase", ""))


async def test_vendor_plugin_registers_and_cards_are_advertised(node: Any) -> None:
    sim, _ = node
    assert sim.plugins.registered() == [GPU]
    assert sim.table.capacity()[GPU] == 2
    for card in sim.cards:
        assert card.host_path.exists()
    cdi = sim.settings.node_dir / "cdi" / "nvidia.com-gpu.json"
    assert "GPU-n1-0" in cdi.read_text()


async def test_pod_runs_with_its_card_and_reports_container_ids(node: Any) -> None:
    sim, api = node
    await sim.kubelet.sync([gpu_pod("a", "uid-a")])
    await wait_until(lambda: phase(api, "default/a") == "Running", what="pod a running")
    statuses = api.status["default/a"]["containerStatuses"]
    assert statuses[0]["containerID"].startswith("containerd://")
    report = sim.settings.node_dir / "util" / "default" / "a" / "main" / "nvidia0.json"
    await wait_until(report.exists, what="workload report")
    await sim.kubelet.sync([])
    await wait_until(lambda: not sim.kubelet.workers, what="pod a removed")


async def test_two_pods_never_share_a_card_and_a_third_is_refused(node: Any) -> None:
    sim, api = node
    pods = [gpu_pod(n, f"uid-{n}") for n in ("a", "b", "c")]
    await sim.kubelet.sync(pods)
    await wait_until(lambda: phase(api, "default/c") == "Failed", what="pod c refused")
    assert api.status["default/c"]["reason"] == "UnexpectedAdmissionError"
    held = [ids for _, res in sim.table.holders() for ids in res.values()]
    assert sorted(i for ids in held for i in ids) == ["GPU-n1-0", "GPU-n1-1"]
    await sim.kubelet.sync([])


async def test_pod_resources_reports_device_ids(node: Any) -> None:
    sim, api = node
    await sim.kubelet.sync([gpu_pod("a", "uid-a"), gpu_pod("b", "uid-b")])
    await wait_until(lambda: phase(api, "default/b") == "Running", what="pod b running")
    async with grpc.aio.insecure_channel(f"unix://{sim.settings.pod_resources_socket}") as ch:
        stub = pr_grpc.PodResourcesListerStub(ch)
        listed = await stub.List(pr.ListPodResourcesRequest())
        got = {
            p.name: [i for c in p.containers for d in c.devices for i in d.device_ids]
            for p in listed.pod_resources
        }
        assert sorted(got["a"] + got["b"]) == ["GPU-n1-0", "GPU-n1-1"]
        one = await stub.Get(pr.GetPodResourcesRequest(pod_name="a", pod_namespace="default"))
        assert one.pod_resources.containers[0].devices[0].resource_name == GPU
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Get(pr.GetPodResourcesRequest(pod_name="zz", pod_namespace="default"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    await sim.kubelet.sync([])


async def test_deleting_a_pod_kills_its_process_and_frees_the_card(node: Any) -> None:
    sim, api = node
    pod = gpu_pod("a", "uid-a", command=["sleep", "300"])
    await sim.kubelet.sync([pod])
    await wait_until(lambda: phase(api, "default/a") == "Running", what="pod a running")
    runner = sim.kubelet.runner
    container_id = sim.kubelet.workers["uid-a"].ids["main"]
    pid = runner._procs[container_id].process.pid
    deleting = parse_pod({**pod_manifest("a", ["sleep"], node="n1", uid="uid-a",
                                         resources={GPU: "1"}),
                          "metadata": {"name": "a", "namespace": "default", "uid": "uid-a",
                                       "deletionTimestamp": "2026-01-01T00:00:00Z"}})  # fmt: skip
    await sim.kubelet.sync([deleting])
    await wait_until(lambda: api.deleted == ["default/a"], what="deletion confirmed")
    assert not alive(pid)
    assert sim.table.free(GPU) == ["GPU-n1-0", "GPU-n1-1"]


async def test_container_exit_sets_the_pod_phase(node: Any) -> None:
    sim, api = node
    await sim.kubelet.sync([gpu_pod("ok", "u1", command=["gpuload", "--once"]),
                            gpu_pod("bad", "u2", command=["sh", "-c", "exit 3"])])  # fmt: skip
    await wait_until(lambda: phase(api, "default/ok") == "Succeeded", what="ok succeeded")
    await wait_until(lambda: phase(api, "default/bad") == "Failed", what="bad failed")
    state = api.status["default/bad"]["containerStatuses"][0]["state"]
    assert state["terminated"]["exitCode"] == 3
    await wait_until(lambda: len(sim.table.free(GPU)) == 2, what="cards released")
    await sim.kubelet.sync([])


async def test_a_container_that_cannot_start_reports_why_in_its_status(node: Any) -> None:
    sim, api = node
    await sim.kubelet.sync([gpu_pod("nostart", "u9", command=["/no/such/program"])])
    await wait_until(lambda: phase(api, "default/nostart") == "Failed", what="nostart failed")
    terminated = api.status["default/nostart"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["reason"] == "StartError" and terminated["exitCode"] == 128
    assert "cannot exec" in terminated["message"] and "/no/such/program" in terminated["message"]
    await sim.kubelet.sync([])


async def test_unhealthy_card_leaves_allocatable(node: Any) -> None:
    sim, _ = node
    await sim.vendor.set_health("GPU-n1-1", healthy=False)
    await wait_until(lambda: sim.table.allocatable()[GPU] == 1, what="allocatable 1")
    assert sim.table.capacity()[GPU] == 2
    await sim.vendor.set_health("GPU-n1-1", healthy=True)
    await wait_until(lambda: sim.table.allocatable()[GPU] == 2, what="allocatable back to 2")


async def test_kubelet_restart_recreates_socket_and_plugins_register_again(node: Any) -> None:
    sim, _ = node
    before = socket_identity(sim.plugins.kubelet_socket)
    registrations = sim.vendor.registrations
    await sim.restart_kubelet()
    assert socket_identity(sim.plugins.kubelet_socket) != before
    await wait_until(lambda: sim.vendor.registrations > registrations, what="re-registration")
    await wait_until(lambda: sim.table.allocatable().get(GPU) == 2, what="cards back")


async def test_exporter_reports_workload_utilisation_per_card_and_pod(node: Any) -> None:
    sim, api = node
    cmd = ["gpuload", "--util", "40", "--mem-mib", "300", "--every-ms", "100"]
    await sim.kubelet.sync([gpu_pod("a", "uid-a", command=cmd)])
    await wait_until(lambda: phase(api, "default/a") == "Running", what="pod a running")

    async def util_line() -> str | None:
        text = await sim.exporter.scrape()
        lines = [ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_GPU_UTIL{")]
        return next((ln for ln in lines if 'pod="a"' in ln and ln.endswith(" 40")), None)

    line = await wait_until(util_line, what="utilisation 40 for pod a")
    assert 'UUID="GPU-n1-0"' in line and 'namespace="default"' in line
    text = await sim.exporter.scrape()
    assert 'DCGM_FI_DEV_FB_USED{gpu="0"' in text and 'gpu="1"' in text
    await sim.kubelet.sync([])
    await wait_until(lambda: not sim.kubelet.workers, what="pod a removed")


async def test_on_failure_pods_restart_until_they_succeed(node: Any) -> None:
    sim, api = node
    marker = sim.settings.node_dir / "restart-marker"
    script = f"test -f {marker} && exit 0; touch {marker}; exit 1"
    body = pod_manifest("r", ["sh", "-c", script], node="n1", uid="uid-r")
    body["spec"]["restartPolicy"] = "OnFailure"
    await sim.kubelet.sync([parse_pod(body)])
    await wait_until(lambda: phase(api, "default/r") == "Succeeded", what="pod r succeeded")
    assert api.status["default/r"]["containerStatuses"][0]["restartCount"] == 1
    await sim.kubelet.sync([])
    await wait_until(lambda: not sim.kubelet.workers, what="pod r removed")


async def test_a_deleted_pod_that_never_ran_here_is_confirmed_at_once(node: Any) -> None:
    sim, api = node
    body = pod_manifest("gone", ["sleep", "1"], node="n1", uid="uid-gone")
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    await sim.kubelet.sync([parse_pod(body)])
    await sim.kubelet.sync([parse_pod(body)])
    assert api.deleted == ["default/gone"] and not sim.kubelet.workers


async def test_a_pod_gone_from_the_api_frees_its_card_for_admission_while_it_dies(node: Any) -> None:
    """As the kubelet's device manager: devices of pods no longer active are free at admission,
    even while their containers are still being killed."""
    import asyncio

    sim, api = node
    a, b = gpu_pod("a", "uid-a", command=["sleep", "300"]), gpu_pod("b", "uid-b", command=["sleep", "300"])
    await sim.kubelet.sync([a, b])
    await wait_until(lambda: phase(api, "default/b") == "Running", what="pods a and b running")
    runner = sim.kubelet.runner
    real_kill, unblock = runner.kill, asyncio.Event()

    async def slow_kill(container_id: str) -> None:
        await unblock.wait()
        await real_kill(container_id)

    runner.kill = slow_kill  # type: ignore[method-assign]
    try:
        await sim.kubelet.sync([b, gpu_pod("c", "uid-c", command=["sleep", "300"])])  # a deleted at once
        await wait_until(lambda: phase(api, "default/c") == "Running", what="pod c admitted")
        assert "uid-a" in sim.kubelet.workers  # a's container is still being killed
    finally:
        unblock.set()
        runner.kill = real_kill  # type: ignore[method-assign]
    await sim.kubelet.sync([])
    await wait_until(lambda: not sim.kubelet.workers, what="every pod removed")


class RestartingApi(RecordingApi):
    """The API server while it restarts: every write fails until ``down`` is cleared."""

    def __init__(self) -> None:
        super().__init__()
        self.down = True
        self.refused = 0

    async def write_pod_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        if self.down:
            self.refused += 1
            raise Retryable(f"patch pod status {namespace}/{name}: connection refused")
        await super().write_pod_status(namespace, name, status)


async def test_a_status_the_api_refused_is_written_again_at_the_next_sync(node: Any) -> None:
    """A container that starts while the API server restarts: its Running status is written when
    the API answers again (at the next sync), not only at the pod's next change."""
    sim, _ = node
    api = RestartingApi()
    sim.kubelet.api = api
    pod = gpu_pod("a", "uid-a", command=["sleep", "60"])
    await sim.kubelet.sync([pod])
    await wait_until(lambda: api.refused >= 1 and sim.kubelet.workers["uid-a"].unreported, what="a refused write")
    await asyncio.sleep(0.5)  # the container runs; nothing changes any more
    assert phase(api, "default/a") == ""
    api.down = False
    await sim.kubelet.sync([pod])
    await wait_until(lambda: phase(api, "default/a") == "Running", what="the status written again")
    assert not sim.kubelet.workers["uid-a"].unreported
    await sim.kubelet.sync([])
    await wait_until(lambda: not sim.kubelet.workers, what="pod a removed")
