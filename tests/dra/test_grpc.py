"""The driver's sockets as the kubelet meets them: registration, bad requests, a restart that
keeps what was prepared; its slice following the cards' health and the solver's spot health."""

from __future__ import annotations

import uuid

import grpc
import pytest
from gpushare_common import dra, events
from gpushare_common.adapters.kubeletapi import dra_health_v1alpha1_pb2 as hpb
from gpushare_common.adapters.kubeletapi import dra_health_v1alpha1_pb2_grpc as hpb_grpc
from gpushare_common.adapters.kubeletapi import dra_v1_pb2 as pb
from gpushare_common.adapters.kubeletapi import dra_v1_pb2_grpc as pb_grpc
from gpushare_common.adapters.kubeletapi import pluginregistration_v1_pb2 as rpb
from gpushare_common.adapters.kubeletapi import pluginregistration_v1_pb2_grpc as rpb_grpc
from gpushare_common.bus import Bus
from gpushare_common.settings import NatsSettings
from gpushare_dra_driver.app import Service
from gpushare_sim.node.testing import wait_until

from tests.dra.harness import DraNode, common, dra_node, driver_settings
from tests.support.kubeapi import (
    KubeApi,
    kube_api,  # noqa: F401  (the fixture)
)

SHARE = {"deviceClassName": dra.SHARE_CLASS, "capacity": {"requests": {dra.SHARES: "40"}}}


async def call(node: DraNode, method: str, claims: list[pb.Claim]) -> object:
    async with grpc.aio.insecure_channel(f"unix://{node.driver.settings.dra_socket}") as channel:
        stub = pb_grpc.DRAPluginStub(channel)
        if method == "prepare":
            return await stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=claims), timeout=5)
        return await stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=claims), timeout=5)


async def test_registration_names_the_driver_its_socket_and_api(kube_api: KubeApi,  # noqa: F811
                                                                nats_settings: NatsSettings) -> None:
    async with dra_node(kube_api, nats_settings, gpus=1) as node:
        socket = node.driver.settings.registration_socket
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            info = await rpb_grpc.RegistrationStub(channel).GetInfo(rpb.InfoRequest(), timeout=5)
        assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == \
            ("DRAPlugin", dra.DRIVER, node.driver.settings.dra_socket, ["v1.DRAPlugin"])
        async with grpc.aio.insecure_channel(f"unix://{node.driver.settings.dra_socket}") as channel:
            stream = hpb_grpc.DRAResourceHealthStub(channel).NodeWatchResources(hpb.NodeWatchResourcesRequest())
            first = await stream.read()
            stream.cancel()
        assert [(d.device.pool_name, d.device.device_name, d.health) for d in first.devices] == \
            [(node.name, "gpu-dra-node-0", hpb.HEALTHY), (node.name, "spot-gpu-dra-node-0", hpb.UNHEALTHY)], \
            "a card, and its spot mirror not lent"


async def test_bad_requests_fail_clearly_and_write_nothing(kube_api: KubeApi,  # noqa: F811
                                                          nats_settings: NatsSettings) -> None:
    async with dra_node(kube_api, nats_settings, gpus=1) as node:
        await wait_until(node.slice_devices, 15, "the node's slice")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(node, "prepare", [pb.Claim(namespace="default", name="c", uid="")])
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "claims[0].uid is empty" in (caught.value.details() or "")
        uid = str(uuid.uuid4())
        reply = await call(node, "prepare", [pb.Claim(namespace="default", name="missing", uid=uid)])
        assert reply.claims[uid].error == "claim default/missing: not found"  # type: ignore[attr-defined]
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "odd", "namespace": "default"}, "spec": {"devices": {"requests": []}}}
        made = await node.create("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", body)
        await node.kube.patch_object("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/odd/status", {
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": dra.DRIVER, "pool": node.name, "device": "gpu-elsewhere"}]}}}})
        odd = made["metadata"]["uid"]
        reply = await call(node, "prepare", [pb.Claim(namespace="default", name="odd", uid=odd)])
        assert "unknown device 'gpu-elsewhere'" in reply.claims[odd].error  # type: ignore[attr-defined]
        assert node.driver.preparer.state.claims == {} and not node.driver.files.spec_names()
        reply = await call(node, "unprepare", [pb.Claim(namespace="default", name="missing", uid=uid)])
        assert reply.claims[uid].error == ""  # type: ignore[attr-defined]


async def test_a_restarted_driver_answers_what_it_prepared(kube_api: KubeApi,  # noqa: F811
                                                           nats_settings: NatsSettings) -> None:
    async with dra_node(kube_api, nats_settings, gpus=1) as node:
        await wait_until(node.slice_devices, 15, "the node's slice")
        await node.classes()
        await node.template("share", SHARE)
        await node.pod("p", "share")
        await node.running("p")
        (claim,) = await node.claims()
        ref = pb.Claim(namespace="default", name=claim["metadata"]["name"], uid=claim["metadata"]["uid"])
        before = (await call(node, "prepare", [ref])).claims[ref.uid]  # type: ignore[attr-defined]
        await node.driver.close()
        again = Service(common(node.name, kube_api.kubeconfig, nats_settings),
                        driver_settings(node.sim.settings.node_dir), node.driver.vendors)
        await again.start()
        node.driver = again
        try:
            after = (await call(node, "prepare", [ref])).claims[ref.uid]  # type: ignore[attr-defined]
            assert after == before and after.devices[0].cdi_device_ids
            assert len(again.files.spec_names()) == 1
        finally:
            await node.kube.delete_pod("default", "p")
            await wait_until(lambda: _gone(node), 30, "pod p gone and its claim unprepared")
            await again.close()


async def _gone(node: DraNode) -> bool:
    return await node.phase("p") == "gone" and not node.driver.files.spec_names()


async def test_the_slice_follows_card_health_and_the_solvers_spot_health(kube_api: KubeApi,  # noqa: F811
                                                                         nats_settings: NatsSettings) -> None:
    async with dra_node(kube_api, nats_settings, gpus=2) as node:
        await wait_until(node.slice_devices, 15, "the node's slice")
        assert node.sim.vendor is not None
        await node.sim.vendor.set_health("GPU-dra-node-1", False)

        async def tainted() -> bool:
            devices = {d["name"]: d for d in await node.slice_devices()}
            return bool(devices.get("gpu-dra-node-1", {}).get("taints"))

        await wait_until(tainted, 10, "the unhealthy card tainted in the slice")
        bus = Bus(nats_settings, "test")
        await bus.connect()
        try:
            await wait_until(lambda: node.driver.bus.is_connected, 10, "the driver on NATS")
            health = events.DeviceHealth(node=node.name, resource="spot-gpu", full=True,
                                         devices={"spot-GPU-dra-node-0": "Healthy", "spot-GPU-dra-node-1": "Healthy"})

            async def spot() -> list[str]:
                # core NATS: the driver may not have subscribed yet when it first goes out (the
                # solver's bucket brings it at the driver's next resync); sent again meanwhile
                await bus.publish(bus.subjects.health(node.name, "spot-gpu"), health)
                return [d["name"] for d in await node.slice_devices() if d["name"].startswith("spot-")]

            assert await wait_until(spot, 10, "the lendable card's spot mirror") == ["spot-gpu-dra-node-0"]
            inventory = await bus.read_after(bus.subjects.event(node.name, "inventory"), 0)
            assert [m.event().devices for m in inventory][-1] == ("GPU-dra-node-0", "GPU-dra-node-1")  # type: ignore[union-attr]
        finally:
            await bus.drain()
