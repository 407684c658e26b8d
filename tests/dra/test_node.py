"""The DRA driver with the API emulator and the sim kubelet over their real sockets: slices
published, claims allocated by the scheduler, prepared before the container starts and
unprepared after, the CDI devices in pod-resources."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
from gpushare_common import dra
from gpushare_common.adapters.kubeletapi import podresources_v1_pb2 as pr
from gpushare_common.adapters.kubeletapi import podresources_v1_pb2_grpc as pr_grpc
from gpushare_common.settings import NatsSettings
from gpushare_sim.node.testing import wait_until

from tests.dra.harness import DraNode, dra_node
from tests.support.kubeapi import (
    KubeApi,
    kube_api,  # noqa: F401  (the fixture)
)

SHARE = {"deviceClassName": dra.SHARE_CLASS, "capacity": {"requests": {dra.SHARES: "25"}}}


async def cdi_of(node: DraNode, pod: str) -> list[str]:
    socket = node.sim.settings.pod_resources_socket
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        reply = await pr_grpc.PodResourcesListerStub(channel).List(pr.ListPodResourcesRequest())
    return [c.name for p in reply.pod_resources if p.name == pod for ct in p.containers
            for d in ct.dynamic_resources for r in d.claim_resources for c in r.cdi_devices]


async def test_shares_are_allocated_prepared_and_unprepared(kube_api: KubeApi,  # noqa: F811
                                                            nats_settings: NatsSettings) -> None:
    async with dra_node(kube_api, nats_settings, gpus=2) as node:
        await wait_until(lambda: node.sim.dra is not None and node.sim.dra.registered() == [dra.DRIVER],
                         15, "the driver registered with the kubelet")
        await wait_until(lambda: node.driver.health.report()["components"]["kubelet"]["ready"], 15, "registered")
        devices = await wait_until(node.slice_devices, 15, "the node's slice")
        assert [d["name"] for d in devices] == ["gpu-dra-node-0", "gpu-dra-node-1"]
        assert devices[1]["attributes"][dra.PCIE_ROOT] == {"string": "pci0000:00"}
        await node.classes()
        await node.template("quarter", SHARE)
        for index in range(5):
            await node.pod(f"share-{index}", "quarter")
        for index in range(5):
            await node.running(f"share-{index}")
        claims = await node.claims()
        cards = sorted(c["status"]["allocation"]["devices"]["results"][0]["device"] for c in claims)
        assert cards == ["gpu-dra-node-0"] * 4 + ["gpu-dra-node-1"], "four quarters fill one card"
        prepared = await wait_until(lambda: node.driver.status_view().prepared, 10,  # type: ignore[attr-defined]
                                    "the claims prepared, as /status shows them")
        assert {p.claim for p in prepared.values()} <= {f"default/{c['metadata']['name']}" for c in claims}
        cdi = await wait_until(lambda: cdi_of(node, "share-0"), 10, "pod-resources lists the CDI device")
        (device,) = cdi
        parsed = dra.parse_cdi_device(device)
        assert parsed.role == dra.ROLE_SHARE and parsed.card == "GPU-dra-node-0"
        spec_dir = Path(node.driver.settings.cdi_dir)
        spec = json.loads((spec_dir / f"gpushare.k8s.io-claim-{parsed.claim_uid}.json").read_text())
        assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"].endswith("/dev/nvidia0")
        for index in range(5):
            await node.kube.delete_pod("default", f"share-{index}")
        await wait_until(lambda: _none_left(node), 30, "pods gone, claims deleted, specs removed")
        assert not node.driver.files.spec_names()
        assert node.driver.preparer.state.claims == {}


async def _none_left(node: DraNode) -> bool:
    phases = [await node.phase(f"share-{i}") for i in range(5)]
    return all(p == "gone" for p in phases) and not await node.claims() and not node.sim.kubelet.claims.prepared  # type: ignore[union-attr]
