"""The sim scheduler's claims against the API emulator: made from templates, allocated from a
node's slice and reserved before the pod is bound, released when the pod goes; and the kubelet's
plugin watcher accepting a DRA driver and refusing anything else."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from gpushare_common import dra
from gpushare_common.adapters.kube import resource_path
from gpushare_common.adapters.kubeletapi import pluginregistration_v1_pb2 as rpb
from gpushare_common.adapters.kubeletapi import pluginregistration_v1_pb2_grpc as rpb_grpc
from gpushare_sim.dra.scheduling import POD_CLAIM_NAME
from gpushare_sim.node.adapters.dra import DraPlugins
from gpushare_sim.node.adapters.kube import SimKube
from gpushare_sim.node.testing import short_sim_dir, wait_until
from gpushare_sim.scheduler import Scheduler

from tests.support.kubeapi import (
    KubeApi,
    kube_api,  # noqa: F401  (the fixture)
)

Obj = dict[str, Any]
NODE = "dra-1"


async def node_with_slice(kube: SimKube, cards: int = 2) -> None:
    await kube.ensure_node(NODE, {"kubernetes.io/hostname": NODE})
    await kube.patch_node_status(NODE, {"conditions": [{"type": "Ready", "status": "True"}],
                                        "allocatable": {"cpu": "8", "memory": "8Gi", "pods": "10"}})
    devices = [{"name": f"gpu-{i}", "attributes": {"kind": {"string": "card"}},
                "capacity": {dra.SHARES: {"value": "100", "requestPolicy": dra.share_policy(100)}},
                "allowMultipleAllocations": True} for i in range(cards)]
    await kube.create_object(resource_path("resourceslices"), {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
        "spec": {"driver": dra.DRIVER, "nodeName": NODE, "devices": devices,
                 "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1}}})
    for name in dra.DEVICE_CLASSES:
        await kube.create_object(resource_path("deviceclasses"), dra.device_class(name))


def pod(name: str, claim: Obj) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"resourceClaims": [{"name": "gpu", **claim}], "containers": [
                {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}]}}


async def template(kube: SimKube, name: str, shares: str) -> None:
    await kube.create_object(resource_path("resourceclaimtemplates", "default"), {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": dra.SHARE_CLASS, "capacity": {"requests": {dra.SHARES: shares}}}}]}}}})


async def claims(kube: SimKube) -> list[Obj]:
    items, _ = await kube.list_objects(resource_path("resourceclaims", "default"))
    return items


async def test_claims_are_made_allocated_reserved_and_released(kube_api: KubeApi) -> None:  # noqa: F811
    kube = SimKube.from_kubeconfig(str(kube_api.kubeconfig))
    scheduler = Scheduler(kube)
    try:
        await node_with_slice(kube)
        await template(kube, "sixty", "60")
        for name in ("a", "b"):
            await kube.create_pod("default", pod(name, {"resourceClaimTemplateName": "sixty"}))
        while await scheduler.schedule_once():
            pass
        made = await claims(kube)
        by_pod = {c["metadata"]["annotations"][POD_CLAIM_NAME] and c["metadata"]["ownerReferences"][0]["name"]: c
                  for c in made}
        results = {p: c["status"]["allocation"]["devices"]["results"] for p, c in by_pod.items()}
        assert {p: r[0]["device"] for p, r in results.items()} == {"a": "gpu-0", "b": "gpu-1"}
        for name in ("a", "b"):
            got = await kube.get_pod("default", name)
            assert got["spec"]["nodeName"] == NODE
            status = got["status"]["resourceClaimStatuses"][0]
            assert status["resourceClaimName"] == by_pod[name]["metadata"]["name"]
            assert by_pod[name]["status"]["reservedFor"] == [{"resource": "pods", "name": name,
                                                              "uid": got["metadata"]["uid"]}]
        await kube.create_pod("default", pod("c", {"resourceClaimTemplateName": "sixty"}))
        assert await scheduler.schedule_once() == 0, "two 60-share claims left no card with 60 shares"
        await kube.delete_pod("default", "a", grace_seconds=0)
        await wait_until(lambda: _gone(kube, "a"), 10, "pod a gone")
        await scheduler.schedule_once()
        await wait_until(lambda: _bound(kube, "c"), 10, "pod c bound to the freed card")
        assert len(await claims(kube)) == 2, "a's claim deleted with its pod, c's made"
    finally:
        await kube.close()


async def test_a_shared_claim_stays_allocated_until_its_last_pod_goes(kube_api: KubeApi) -> None:  # noqa: F811
    kube = SimKube.from_kubeconfig(str(kube_api.kubeconfig))
    scheduler = Scheduler(kube)
    try:
        await node_with_slice(kube, cards=1)
        await kube.create_object(resource_path("resourceclaims", "default"), {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "shared", "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": dra.EXCLUSIVE_CLASS}}]}}})
        for name in ("x", "y"):
            await kube.create_pod("default", pod(name, {"resourceClaimName": "shared"}))
        while await scheduler.schedule_once():
            pass
        (claim,) = await claims(kube)
        assert sorted(r["name"] for r in claim["status"]["reservedFor"]) == ["x", "y"]
        await kube.delete_pod("default", "x", grace_seconds=0)
        await scheduler.schedule_once()
        (claim,) = await claims(kube)
        assert [r["name"] for r in claim["status"]["reservedFor"]] == ["y"] and claim["status"]["allocation"]
        await kube.delete_pod("default", "y", grace_seconds=0)
        await scheduler.schedule_once()
        (claim,) = await claims(kube)
        assert not (claim.get("status") or {}).get("allocation"), "an unreserved claim is deallocated"
    finally:
        await kube.close()


async def test_a_pod_whose_template_is_missing_waits_with_an_event(kube_api: KubeApi) -> None:  # noqa: F811
    kube = SimKube.from_kubeconfig(str(kube_api.kubeconfig))
    try:
        await node_with_slice(kube)
        await kube.create_pod("default", pod("lost", {"resourceClaimTemplateName": "nope"}))
        scheduler = Scheduler(kube)
        assert await scheduler.schedule_once() == 0
        assert "ResourceClaimTemplate default/nope not found" in scheduler._waiting["default/lost"]
    finally:
        await kube.close()


async def _gone(kube: SimKube, name: str) -> bool:
    pods, _ = await kube.list_pods("default")
    return all(p["metadata"]["name"] != name for p in pods)


async def _bound(kube: SimKube, name: str) -> bool:
    return bool((await kube.get_pod("default", name))["spec"].get("nodeName"))


class Registration(rpb_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, info: rpb.PluginInfo) -> None:
        self.info = info
        self.status: list[tuple[bool, str]] = []

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return self.info

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.status.append((request.plugin_registered, request.error))
        return rpb.RegistrationStatusResponse()


async def serve(path: Path, servicer: Registration) -> grpc.aio.Server:
    server = grpc.aio.server()
    rpb_grpc.add_RegistrationServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    return server


@pytest.mark.parametrize("info, why", [
    (rpb.PluginInfo(type="CSIPlugin", name="x.example.com", supported_versions=["v1.DRAPlugin"]), "is not DRAPlugin"),
    (rpb.PluginInfo(type="DRAPlugin", name="x.example.com", supported_versions=["v1beta1.DRAPlugin"]),
     "do not include v1.DRAPlugin"),
    (rpb.PluginInfo(type="DRAPlugin", name="x.example.com", endpoint="/nonexistent.sock",
                    supported_versions=["v1.DRAPlugin"]), "not an existing socket"),
])
async def test_the_plugin_watcher_refuses_what_is_no_dra_plugin(info: rpb.PluginInfo, why: str) -> None:
    directory = short_sim_dir()
    servicer = Registration(info)
    server = await serve(directory / "x.sock", servicer)
    plugins = DraPlugins(directory)
    try:
        await plugins.scan()
        await plugins.scan()  # the same socket is not asked twice
        assert plugins.registered() == [] and len(servicer.status) == 1
        registered, error = servicer.status[0]
        assert not registered and why in error
    finally:
        await server.stop(0)
        await plugins.close()


async def test_the_plugin_watcher_registers_a_driver_and_forgets_it_with_its_socket() -> None:
    directory = short_sim_dir()
    endpoint = directory / "plugin" / "dra.sock"  # the driver's own socket lives outside the registry
    endpoint.parent.mkdir()
    endpoint.touch()
    servicer = Registration(rpb.PluginInfo(type="DRAPlugin", name=dra.DRIVER, endpoint=str(endpoint),
                                           supported_versions=["v1.DRAPlugin"]))
    server = await serve(directory / "reg.sock", servicer)
    plugins = DraPlugins(directory)
    try:
        await plugins.scan()
        assert plugins.registered() == [dra.DRIVER] and servicer.status == [(True, "")]
        await server.stop(0)
        (directory / "reg.sock").unlink(missing_ok=True)
        await plugins.scan()
        assert plugins.registered() == []
    finally:
        await plugins.close()
        await asyncio.sleep(0)
