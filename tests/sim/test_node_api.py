"""The node simulator and the scheduler against the API emulator: the Node
appears with the fake cards as capacity, pods get bound, run, report status,
and a deletion in the API kills the container and removes the pod."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from typing import Any

import kubernetes
import pytest
from gpushare_sim.node.adapters.kube import SimKube
from gpushare_sim.node.adapters.runners import ProcessRunner
from gpushare_sim.node.app import NodeSim
from gpushare_sim.node.settings import NodeSimSettings
from gpushare_sim.node.testing import pod_manifest, running_node, short_sim_dir, wait_until
from gpushare_sim.scheduler import Scheduler

from tests.sim.kubectl import Kubectl
from tests.sim.test_node_kubelet import GPU, TOOLS
from tests.support.kubeapi import KubeApi as Emulator
from tests.support.kubeapi import kube_api  # noqa: F401  (the fixture)


class Cluster:
    def __init__(self, emulator: Emulator, nodes: list[NodeSim]) -> None:
        self.core = kubernetes.client.CoreV1Api(emulator.new_client())
        self.nodes = nodes

    async def get(self, kind: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        def read() -> Any:
            if kind == "node":
                return self.core.read_node(name, _preload_content=False)
            return self.core.read_namespaced_pod(name, namespace, _preload_content=False)

        try:
            return dict(json.loads((await asyncio.to_thread(read)).data))
        except kubernetes.client.exceptions.ApiException as err:
            if err.status == 404:
                return None
            raise

    async def create_pod(self, body: dict[str, Any]) -> None:
        await asyncio.to_thread(self.core.create_namespaced_pod, "default", body,
                                _preload_content=False)  # fmt: skip

    async def delete_pod(self, name: str) -> None:
        await asyncio.to_thread(self.core.delete_namespaced_pod, name, "default",
                                _preload_content=False)  # fmt: skip

    async def phase(self, name: str) -> str:
        pod = await self.get("pod", name)
        return str(((pod or {}).get("status") or {}).get("phase", ""))


@pytest.fixture
async def cluster(kube_api: Emulator) -> AsyncIterator[Cluster]:  # noqa: F811
    sim_dir = short_sim_dir()
    stop = asyncio.Event()
    tasks: list[asyncio.Task[Any]] = []
    try:
        async with (
            _node("n1", sim_dir, kube_api) as n1,
            _node("n2", sim_dir, kube_api) as n2,
        ):
            scheduler = Scheduler(SimKube.from_kubeconfig(str(kube_api.kubeconfig)), 0.05)
            for sim in (n1, n2):
                tasks += [asyncio.create_task(sim.sync_loop(stop)),
                          asyncio.create_task(sim.node_status_loop())]  # fmt: skip
            tasks.append(asyncio.create_task(scheduler.run(stop)))
            yield Cluster(kube_api, [n1, n2])
            stop.set()
            _, pending = await asyncio.wait(tasks, timeout=2)
            for task in pending:  # the node status loops run until cancelled
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for api in (scheduler.api, n1.api, n2.api):
                await api.close()  # type: ignore[union-attr]
    finally:
        shutil.rmtree(sim_dir, ignore_errors=True)


def _node(name: str, sim_dir: Any, emulator: Emulator) -> Any:
    settings = NodeSimSettings(name=name, sim_dir=sim_dir, gpus=1, containerd="none",
                               kubeconfig=str(emulator.kubeconfig), sync_interval_s=0.05)  # fmt: skip
    return running_node(settings, SimKube.from_kubeconfig(str(emulator.kubeconfig)),
                        ProcessRunner([TOOLS]))  # fmt: skip


async def test_nodes_register_with_their_cards(cluster: Cluster) -> None:
    async def gpus() -> bool:
        node = await cluster.get("node", "n1")
        allocatable = ((node or {}).get("status") or {}).get("allocatable") or {}
        return bool(allocatable.get(GPU) == "1")

    await wait_until(gpus, what="node n1 advertises 1 card")
    node = await cluster.get("node", "n2")
    assert node is not None
    assert node["metadata"]["labels"]["gpushare.k8s.io/sim-node"] == "true"


async def test_pods_are_scheduled_run_and_are_removed_on_deletion(cluster: Cluster) -> None:
    for sim in cluster.nodes:
        await wait_until(lambda s=sim: s.table.allocatable().get(GPU) == 1, what="cards")
    cmd = ["gpuload", "--util", "10", "--every-ms", "100"]
    for name in ("a", "b", "c"):
        await cluster.create_pod(pod_manifest(name, cmd, resources={GPU: "1"}))
    for name in ("a", "b"):
        await wait_until(lambda n=name: _is(cluster.phase(n), "Running"), what=f"{name} running")
    pod_a, pod_b = await cluster.get("pod", "a"), await cluster.get("pod", "b")
    assert pod_a and pod_b and pod_a["spec"]["nodeName"] != pod_b["spec"]["nodeName"]
    status = pod_a["status"]["containerStatuses"][0]
    assert status["containerID"].startswith("containerd://") and status["ready"]
    pod_c = await cluster.get("pod", "c")
    assert pod_c and not pod_c["spec"].get("nodeName"), "no card left: c stays Pending"

    await cluster.delete_pod("a")
    await wait_until(lambda: _gone(cluster, "a"), what="pod a removed")
    await wait_until(lambda: _is(cluster.phase("c"), "Running"), what="c runs on the freed card")
    for name in ("b", "c"):
        await cluster.delete_pod(name)
        await wait_until(lambda n=name: _gone(cluster, n), what=f"pod {name} removed")
    assert all(not sim.kubelet.workers for sim in cluster.nodes)


async def _is(value: Any, expected: str) -> bool:
    return bool(await value == expected)


async def _gone(cluster: Cluster, name: str) -> bool:
    return await cluster.get("pod", name) is None


async def test_a_node_keeps_its_lease_and_reports_its_heartbeat(cluster: Cluster, kubectl: Kubectl) -> None:
    """What ``kubectl describe node`` reads of a kubelet: the node's Lease in kube-node-lease, held
    by the node and owned by its Node object, renewed (not overwritten blindly); and the Ready
    condition's heartbeat."""
    leases = kubernetes.client.CoordinationV1Api(cluster.core.api_client)
    n1 = cluster.nodes[0]
    await n1.renew_lease()
    first = await asyncio.to_thread(leases.read_namespaced_lease, "n1", "kube-node-lease")
    node = await cluster.get("node", "n1")
    assert node is not None
    assert (first.spec.holder_identity, first.spec.lease_duration_seconds) == ("n1", 40)
    assert [(r.kind, r.name, r.uid) for r in first.metadata.owner_references] == [
        ("Node", "n1", node["metadata"]["uid"])]
    await n1.renew_lease()
    renewed = await asyncio.to_thread(leases.read_namespaced_lease, "n1", "kube-node-lease")
    assert renewed.spec.renew_time > first.spec.renew_time
    assert renewed.metadata.resource_version != first.metadata.resource_version

    async def heartbeat() -> str:
        current = await cluster.get("node", "n1")
        ready = [c for c in (current or {}).get("status", {}).get("conditions", []) if c["type"] == "Ready"]
        return str(ready[0].get("lastHeartbeatTime", "")) if ready else ""

    await wait_until(heartbeat, what="the Ready condition's heartbeat")
    described = await asyncio.to_thread(kubectl.ok, "describe", "node", "n1")
    assert "HolderIdentity:  n1" in described and "RenewTime:" in described
    assert "<unset>" not in described.split("RenewTime:")[1].splitlines()[0]
