"""The kubelet's device manager, gRPC side.

Serves the ``Registration`` service on ``<plugin dir>/kubelet.sock``; for every
registered plugin dials its socket, follows ``ListAndWatch`` into the
:class:`DeviceTable`, and calls ``GetPreferredAllocation`` / ``Allocate`` on
admission.  ``restart()`` behaves like a kubelet restart: the socket is
re-created and every plugin must register again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from gpushare_common.adapters.kubeletapi import deviceplugin_v1beta1_pb2 as dp
from gpushare_common.adapters.kubeletapi import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from gpushare_common.ids import IdError, check_resource_name

from gpushare_sim.node.devices import DeviceTable
from gpushare_sim.node.model import BindMount, DeviceNode

log = logging.getLogger("gpushare_sim.node.deviceplugins")

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
RPC_TIMEOUT = 10.0


class PluginError(Exception):
    """A device plugin failed or answered something unusable."""


@dataclass
class ContainerAllocation:
    """What plugins answered for one container, merged across resources."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[BindMount] = field(default_factory=list)
    devices: list[DeviceNode] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: list[str] = field(default_factory=list)

    def merge(self, resp: dp.ContainerAllocateResponse) -> None:
        self.envs.update(resp.envs)
        self.annotations.update(resp.annotations)
        self.mounts += [BindMount(m.container_path, m.host_path, m.read_only) for m in resp.mounts]
        self.devices += [DeviceNode(d.container_path, d.host_path, d.permissions or "rwm") for d in resp.devices]
        self.cdi_devices += [c.name for c in resp.cdi_devices]


@dataclass
class _Endpoint:
    resource: str
    socket: Path
    preferred: bool
    channel: grpc.aio.Channel
    stub: dp_grpc.DevicePluginStub
    follower: asyncio.Task[None] | None = None

    async def close(self) -> None:
        if self.follower is not None:
            self.follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.follower
        await self.channel.close()


class _Registration(dp_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, manager: DevicePluginManager) -> None:
        self._manager = manager

    async def Register(self, request: dp.RegisterRequest, context: grpc.aio.ServicerContext) -> dp.Empty:
        problem = self._manager.check_registration(request)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        await self._manager.add_endpoint(request)
        return dp.Empty()


class DevicePluginManager:
    def __init__(self, plugin_dir: Path, table: DeviceTable, on_change: Callable[[], None]) -> None:
        self.plugin_dir = plugin_dir
        self.table = table
        self._on_change = on_change
        self._endpoints: dict[str, _Endpoint] = {}
        self._server: grpc.aio.Server | None = None
        self.restarts = 0

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    def registered(self) -> list[str]:
        return sorted(self._endpoints)

    async def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.kubelet_socket.unlink(missing_ok=True)
        server = grpc.aio.server()
        dp_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.kubelet_socket}")
        await server.start()
        self._server = server
        log.info("kubelet registration serving socket=%s", self.kubelet_socket)

    async def stop(self) -> None:
        for endpoint in list(self._endpoints.values()):
            await endpoint.close()
        self._endpoints.clear()
        if self._server is not None:
            await self._server.stop(grace=0.5)
            self._server = None
        self.kubelet_socket.unlink(missing_ok=True)

    async def restart(self) -> None:
        """Like a kubelet restart: forget every plugin and re-create kubelet.sock."""
        await self.stop()
        for resource in list(self.table.resources):
            self.table.drop_resource(resource)
        self._on_change()
        self.restarts += 1
        await self.start()

    def check_registration(self, request: dp.RegisterRequest) -> str | None:
        if request.version != API_VERSION:
            return f"unsupported device plugin API version {request.version!r}"
        try:
            check_resource_name(request.resource_name)
        except IdError as err:
            return str(err)
        if "/" in request.endpoint or not request.endpoint:
            return f"endpoint {request.endpoint!r} must be a socket name in {self.plugin_dir}"
        return None

    async def add_endpoint(self, request: dp.RegisterRequest) -> None:
        old = self._endpoints.pop(request.resource_name, None)
        if old is not None:
            await old.close()
        socket = self.plugin_dir / request.endpoint
        channel = grpc.aio.insecure_channel(f"unix://{socket}")
        endpoint = _Endpoint(
            request.resource_name,
            socket,
            request.options.get_preferred_allocation_available,
            channel,
            dp_grpc.DevicePluginStub(channel),
        )
        endpoint.follower = asyncio.create_task(self._follow(endpoint), name=f"listandwatch-{request.resource_name}")
        self._endpoints[request.resource_name] = endpoint
        log.info("device plugin registered resource=%s socket=%s", endpoint.resource, socket)

    async def _follow(self, endpoint: _Endpoint) -> None:
        try:
            async for resp in endpoint.stub.ListAndWatch(dp.Empty()):
                devices = {d.ID: d.health == "Healthy" for d in resp.devices}
                self.table.set_devices(endpoint.resource, devices)
                self._on_change()
            log.info("ListAndWatch ended resource=%s", endpoint.resource)
        except grpc.RpcError as err:
            log.warning("ListAndWatch failed resource=%s: %s", endpoint.resource, err.code())
        self.table.mark_all_unhealthy(endpoint.resource)
        self._on_change()

    async def preferred(self, resource: str, available: list[str], size: int) -> list[str]:
        endpoint = self._endpoints.get(resource)
        if endpoint is None or not endpoint.preferred:
            return available[:size]
        req = dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=size)
            ]
        )
        try:
            resp = await endpoint.stub.GetPreferredAllocation(req, timeout=RPC_TIMEOUT)
        except grpc.RpcError as err:
            log.warning("GetPreferredAllocation failed resource=%s: %s", resource, err.code())
            return available[:size]
        chosen = list(resp.container_responses[0].deviceIDs) if resp.container_responses else []
        valid = len(chosen) == size and set(chosen) <= set(available)
        return chosen if valid else available[:size]

    async def allocate(self, resource: str, device_ids: list[str]) -> dp.ContainerAllocateResponse:
        endpoint = self._endpoints.get(resource)
        if endpoint is None:
            raise PluginError(f"no device plugin registered for {resource}")
        container = dp.ContainerAllocateRequest(devices_ids=device_ids)
        req = dp.AllocateRequest(container_requests=[container])
        try:
            resp = await endpoint.stub.Allocate(req, timeout=RPC_TIMEOUT)
        except grpc.RpcError as err:
            raise PluginError(f"Allocate {resource} {device_ids}: {err.details()}") from None
        if len(resp.container_responses) != 1:
            raise PluginError(f"Allocate {resource}: expected 1 container response")
        return resp.container_responses[0]
