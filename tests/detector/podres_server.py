"""A real kubelet pod-resources v1 gRPC server on a unix socket, answering from a mutable table."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from gpushare_common.adapters.kubeletapi import podresources_v1_pb2 as pr
from gpushare_common.adapters.kubeletapi import podresources_v1_pb2_grpc as pr_grpc

# "<namespace>/<pod>" -> container -> resource -> device ids
Table = dict[str, dict[str, dict[str, tuple[str, ...]]]]


def _pod(key: str, containers: dict[str, dict[str, tuple[str, ...]]]) -> pr.PodResources:
    namespace, name = key.split("/", 1)
    return pr.PodResources(name=name, namespace=namespace, containers=[
        pr.ContainerResources(name=c, devices=[pr.ContainerDevices(resource_name=r, device_ids=list(i))
                                               for r, i in res.items()])
        for c, res in containers.items()])


class _Lister(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, table: Table) -> None:
        self.table = table
        self.calls = 0
        self.allocatable: dict[str, tuple[str, ...]] | None = None  # None: a kubelet without the call
        self.list_fails = False  # List answers UNAVAILABLE (the rest keeps working)

    async def List(self, request: object, context: grpc.aio.ServicerContext) -> pr.ListPodResourcesResponse:
        self.calls += 1
        if self.list_fails:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "List failing on purpose")
        return pr.ListPodResourcesResponse(pod_resources=[_pod(k, v) for k, v in self.table.items()])

    async def Get(self, request: pr.GetPodResourcesRequest, context: grpc.aio.ServicerContext
                  ) -> pr.GetPodResourcesResponse:
        self.calls += 1
        key = f"{request.pod_namespace}/{request.pod_name}"
        if key not in self.table:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"pod {key} not found")
        return pr.GetPodResourcesResponse(pod_resources=_pod(key, self.table[key]))

    async def GetAllocatableResources(self, request: object, context: grpc.aio.ServicerContext
                                      ) -> pr.AllocatableResourcesResponse:
        self.calls += 1
        if self.allocatable is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "GetAllocatableResources not served")
        # the kubelet lists one group per resource and NUMA node: split each list in two
        groups = [(r, list(ids[i::2])) for r, ids in sorted(self.allocatable.items()) for i in (0, 1)]
        return pr.AllocatableResourcesResponse(devices=[
            pr.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in groups if ids])


class PodResourcesServer:
    def __init__(self, socket: Path, table: Table, lister: _Lister, server: grpc.aio.Server) -> None:
        self.socket = socket
        self.table = table
        self.lister = lister
        self.server = server


@contextlib.asynccontextmanager
async def serve_pod_resources(socket: Path) -> AsyncIterator[PodResourcesServer]:
    table: Table = {}
    lister = _Lister(table)
    server = grpc.aio.server()
    pr_grpc.add_PodResourcesListerServicer_to_server(lister, server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    try:
        yield PodResourcesServer(socket, table, lister, server)
    finally:
        await server.stop(grace=None)
