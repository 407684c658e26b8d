"""The kubelet pod-resources v1 API (a gRPC client on the kubelet's unix socket).

Answers which device IDs each container of each pod on the node was given,
per resource, and which devices the kubelet can allocate at all.
Errors are :class:`PodResourcesError`; no gRPC exception escapes.

:class:`PodResources` is the services' asyncio client; :func:`container_devices` is one
blocking ``Get`` for a short-lived process (the runtime asks it once per create).
"""

from __future__ import annotations

from typing import TypeAlias

import grpc

from gpushare_common import dra
from gpushare_common.adapters.kubeletapi import podresources_v1_pb2 as pr  # type: ignore[attr-defined]
from gpushare_common.adapters.kubeletapi import podresources_v1_pb2_grpc as pr_grpc  # type: ignore[attr-defined]

# resource name -> device ids, for one container
ContainerDevices: TypeAlias = dict[str, tuple[str, ...]]
# "<namespace>/<pod>" -> container name -> resource -> device ids
NodeDevices: TypeAlias = dict[str, dict[str, ContainerDevices]]


class PodResourcesError(Exception):
    def __init__(self, socket: str, what: str, reason: str) -> None:
        self.socket = socket
        self.reason = reason
        super().__init__(f"pod-resources {what} on {socket}: {reason}")


class PodNotFound(PodResourcesError):
    pass


def _pod_devices(pod: pr.PodResources) -> dict[str, ContainerDevices]:
    containers: dict[str, ContainerDevices] = {}
    for container in pod.containers:
        devices: dict[str, tuple[str, ...]] = {}
        for group in container.devices:
            merged = devices.get(group.resource_name, ()) + tuple(group.device_ids)
            devices[group.resource_name] = tuple(sorted(set(merged)))
        cdi = [c.name for d in container.dynamic_resources for r in d.claim_resources for c in r.cdi_devices
               if dra.is_ours(c.name)]
        if cdi:  # claims of gpushare's DRA driver, read back by the handlers
            devices[dra.CDI_KIND] = tuple(sorted(set(cdi)))
        containers[container.name] = devices
    return containers


def _failure(err: grpc.RpcError, socket: str, what: str) -> PodResourcesError:
    code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = err.details() if isinstance(err, grpc.Call) else str(err)
    kind = PodNotFound if code == grpc.StatusCode.NOT_FOUND else PodResourcesError
    return kind(socket, what, f"{code.name}: {details}")


def container_devices(socket: str, namespace: str, pod: str, container: str,
                      timeout_s: float) -> ContainerDevices:
    """The devices the kubelet allocated to one container, by resource; blocking, one call
    (``List`` when the kubelet does not serve ``Get``). :class:`PodNotFound` when the kubelet
    has no such pod; an unknown container has no devices."""
    what = f"Get {namespace}/{pod}"
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = pr_grpc.PodResourcesListerStub(channel)
        try:
            found = stub.Get(pr.GetPodResourcesRequest(pod_name=pod, pod_namespace=namespace),
                             timeout=timeout_s).pod_resources
        except grpc.RpcError as err:
            if not (isinstance(err, grpc.Call) and err.code() == grpc.StatusCode.UNIMPLEMENTED):
                raise _failure(err, socket, what) from None
            found = _listed(stub, socket, namespace, pod, timeout_s)
    return _pod_devices(found).get(container, {})


def _listed(stub: pr_grpc.PodResourcesListerStub, socket: str, namespace: str, pod: str,
            timeout_s: float) -> pr.PodResources:
    try:
        reply = stub.List(pr.ListPodResourcesRequest(), timeout=timeout_s)
    except grpc.RpcError as err:
        raise _failure(err, socket, "List") from None
    for found in reply.pod_resources:
        if (found.namespace, found.name) == (namespace, pod):
            return found
    raise PodNotFound(socket, f"List for {namespace}/{pod}", "not on this node")


class PodResources:
    """A client of one kubelet; ``close()`` when done."""

    def __init__(self, socket: str, timeout_s: float = 2.0) -> None:
        self.socket = socket
        self.timeout_s = timeout_s
        self._channel = grpc.aio.insecure_channel(f"unix://{socket}")
        self._stub = pr_grpc.PodResourcesListerStub(self._channel)

    async def list(self) -> NodeDevices:
        """Every pod's containers and their devices, keyed by ``<namespace>/<name>``."""
        try:
            reply = await self._stub.List(pr.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as err:
            raise PodResourcesError(self.socket, "List", f"{err.code().name}: {err.details()}") from None
        return {f"{p.namespace}/{p.name}": _pod_devices(p) for p in reply.pod_resources}

    async def get(self, namespace: str, name: str) -> dict[str, ContainerDevices]:
        """One pod's containers and devices; :class:`PodNotFound` when the kubelet has no such pod."""
        request = pr.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace)
        try:
            reply = await self._stub.Get(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:  # kubelets without the Get call
                return await self._get_from_list(namespace, name)
            kind = PodNotFound if err.code() == grpc.StatusCode.NOT_FOUND else PodResourcesError
            raise kind(self.socket, f"Get {namespace}/{name}",
                       f"{err.code().name}: {err.details()}") from None
        return _pod_devices(reply.pod_resources)

    async def _get_from_list(self, namespace: str, name: str) -> dict[str, ContainerDevices]:
        found = (await self.list()).get(f"{namespace}/{name}")
        if found is None:
            raise PodNotFound(self.socket, f"Get {namespace}/{name}", "not on this node")
        return found

    async def allocatable(self) -> dict[str, tuple[str, ...]]:
        """Every device the kubelet can allocate, by resource (``GetAllocatableResources``)."""
        try:
            reply = await self._stub.GetAllocatableResources(pr.AllocatableResourcesRequest(),
                                                             timeout=self.timeout_s)
        except grpc.aio.AioRpcError as err:
            raise PodResourcesError(self.socket, "GetAllocatableResources",
                                    f"{err.code().name}: {err.details()}") from None
        found: dict[str, set[str]] = {}
        for group in reply.devices:  # one group per resource and NUMA node
            found.setdefault(group.resource_name, set()).update(group.device_ids)
        return {resource: tuple(sorted(ids)) for resource, ids in found.items()}

    async def close(self) -> None:
        await self._channel.close()
