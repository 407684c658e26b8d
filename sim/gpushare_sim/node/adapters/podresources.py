"""The kubelet pod-resources v1 API on a unix socket: which device IDs each
container of each pod on the node was given, and the CDI devices of its resource claims."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import grpc
from gpushare_common.adapters.kubeletapi import podresources_v1_pb2 as pr
from gpushare_common.adapters.kubeletapi import podresources_v1_pb2_grpc as pr_grpc

from gpushare_sim.node.devices import ContainerKey, DeviceTable

log = logging.getLogger("gpushare_sim.node.podresources")

# (namespace, pod name, pod uid, container names) of every pod the node runs.
PodLister = Callable[[], list[tuple[str, str, str, list[str]]]]
# (pod uid, container) -> (claim namespace, claim name, CDI devices) of its resource claims
ClaimLister = Callable[[str, str], list[tuple[str, str, list[str]]]]


def _no_claims(uid: str, container: str) -> list[tuple[str, str, list[str]]]:
    return []


def _container(table: DeviceTable, key: ContainerKey, claims: ClaimLister) -> pr.ContainerResources:
    devices = [pr.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in sorted(table.devices_of(key).items())]
    dynamic = [pr.DynamicResource(claim_name=name, claim_namespace=ns, claim_resources=[
        pr.ClaimResource(cdi_devices=[pr.CDIDevice(name=c) for c in cdi])]) for ns, name, cdi in claims(key.pod_uid,
                                                                                                       key.container)]
    return pr.ContainerResources(name=key.container, devices=devices, dynamic_resources=dynamic)


def pod_resources(table: DeviceTable, pods: PodLister, claims: ClaimLister = _no_claims) -> list[pr.PodResources]:
    return [
        pr.PodResources(
            name=name,
            namespace=ns,
            containers=[_container(table, ContainerKey(uid, ns, name, c), claims) for c in containers],
        )
        for ns, name, uid, containers in pods()
    ]


class _Lister(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, table: DeviceTable, pods: PodLister, claims: ClaimLister) -> None:
        self._table = table
        self._pods = pods
        self._claims = claims

    async def List(
        self, request: pr.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pr.ListPodResourcesResponse:
        return pr.ListPodResourcesResponse(pod_resources=pod_resources(self._table, self._pods, self._claims))

    async def Get(
        self, request: pr.GetPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pr.GetPodResourcesResponse:
        for pod in pod_resources(self._table, self._pods, self._claims):
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return pr.GetPodResourcesResponse(pod_resources=pod)
        await context.abort(
            grpc.StatusCode.NOT_FOUND,
            f"pod {request.pod_namespace}/{request.pod_name} not found on this node",
        )
        raise AssertionError("unreachable")

    async def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pr.AllocatableResourcesResponse:
        devices = [
            pr.ContainerDevices(resource_name=r, device_ids=sorted(i for i, ok in d.items() if ok))
            for r, d in sorted(self._table.resources.items())
        ]
        return pr.AllocatableResourcesResponse(devices=devices)


class PodResourcesServer:
    def __init__(self, socket: Path, table: DeviceTable, pods: PodLister, claims: ClaimLister = _no_claims) -> None:
        self.socket = socket
        self._servicer = _Lister(table, pods, claims)
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        server = grpc.aio.server()
        pr_grpc.add_PodResourcesListerServicer_to_server(self._servicer, server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server
        log.info("pod-resources serving socket=%s", self.socket)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=0.5)
            self._server = None
        self.socket.unlink(missing_ok=True)
