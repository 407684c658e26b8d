"""The fake vendor device plugin: ``nvidia.com/gpu`` for the fake cards.

A real kubelet device plugin (v1beta1): it serves its own unix socket in the
node's device-plugins directory, registers with ``kubelet.sock`` (again
whenever that socket is re-created), streams the cards through
``ListAndWatch`` and answers ``Allocate`` with a DeviceSpec per card and
``NVIDIA_VISIBLE_DEVICES``, exactly like NVIDIA's plugin, so gpushare's spot
plugin can dial it as a client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from gpushare_common.adapters.kubeletapi import deviceplugin_v1beta1_pb2 as dp
from gpushare_common.adapters.kubeletapi import deviceplugin_v1beta1_pb2_grpc as dp_grpc

from gpushare_sim.fakegpu.cards import VENDOR_RESOURCE, FakeCard

log = logging.getLogger("gpushare_sim.fakegpu.plugin")

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"


class _Servicer(dp_grpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, plugin: VendorPlugin) -> None:
        self._plugin = plugin

    async def GetDevicePluginOptions(
        self, request: dp.Empty, context: grpc.aio.ServicerContext
    ) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(
        self, request: dp.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[dp.ListAndWatchResponse]:
        async for devices in self._plugin.watch_devices():
            yield dp.ListAndWatchResponse(devices=devices)

    async def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> dp.PreferredAllocationResponse:
        return dp.PreferredAllocationResponse(
            container_responses=[
                dp.ContainerPreferredAllocationResponse(deviceIDs=self._plugin.prefer(req))
                for req in request.container_requests
            ]
        )

    async def Allocate(
        self, request: dp.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> dp.AllocateResponse:
        responses = []
        for req in request.container_requests:
            unknown = [i for i in req.devices_ids if i not in self._plugin.cards]
            if unknown:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown devices {unknown}")
            responses.append(self._plugin.allocate(list(req.devices_ids)))
        return dp.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()


class VendorPlugin:
    """``start()``, ``stop()``, ``devices()``; ``set_health()`` drives fault tests."""

    def __init__(
        self,
        cards: list[FakeCard],
        plugin_dir: Path,
        resource: str = VENDOR_RESOURCE,
        socket_name: str = "nvidia-gpu.sock",  # the NVIDIA plugin's own socket name
        watch_interval: float = 0.2,
        register: bool = True,  # False: discovery only (a DRA node), never registered with the kubelet
    ) -> None:
        self.cards = {card.device_id: card for card in cards}
        self.resource = resource
        self.plugin_dir = plugin_dir
        self.socket_path = plugin_dir / socket_name
        self._health = dict.fromkeys(self.cards, HEALTHY)
        self._changed = asyncio.Condition()
        self._version = 0
        self._stopping = asyncio.Event()
        self._server: grpc.aio.Server | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._watch_interval = watch_interval
        self._registered_with: tuple[int, int] | None = None
        self.registrations = 0
        self.register_with_kubelet = register

    def devices(self) -> list[dp.Device]:
        """Every card with its health and, as NVIDIA's plugin reports it, its NUMA node."""
        return [dp.Device(ID=i, health=h, topology=dp.TopologyInfo(nodes=[dp.NUMANode(ID=self.cards[i].numa_node)]))
                for i, h in sorted(self._health.items())]

    async def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        self._stopping.clear()
        server = grpc.aio.server()
        dp_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        await self._dial_self()
        if self.register_with_kubelet:
            with contextlib.suppress(OSError, grpc.RpcError):
                await self.register()
            self._watcher = asyncio.create_task(self._watch_kubelet(), name="fakegpu-kubelet-watch")
        log.info("vendor plugin started resource=%s socket=%s", self.resource, self.socket_path)

    async def stop(self) -> None:
        self._stopping.set()
        async with self._changed:
            self._changed.notify_all()
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        if self._server is not None:
            await self._server.stop(grace=0.5)
            self._server = None
        self.socket_path.unlink(missing_ok=True)

    async def set_health(self, device_id: str, healthy: bool) -> None:
        if device_id not in self._health:
            raise KeyError(device_id)
        self._health[device_id] = HEALTHY if healthy else UNHEALTHY
        async with self._changed:
            self._version += 1
            self._changed.notify_all()

    async def watch_devices(self) -> AsyncIterator[list[dp.Device]]:
        seen = -1
        while not self._stopping.is_set():
            if seen != self._version:
                seen = self._version
                yield self.devices()
                continue
            async with self._changed:
                await self._changed.wait()

    def prefer(self, req: dp.ContainerPreferredAllocationRequest) -> list[str]:
        chosen = list(dict.fromkeys(req.must_include_deviceIDs))
        rest = sorted(
            (i for i in req.available_deviceIDs if i not in chosen and i in self.cards),
            key=lambda i: self.cards[i].index,
        )
        return (chosen + rest)[: max(req.allocation_size, len(chosen))]

    def allocate(self, device_ids: list[str]) -> dp.ContainerAllocateResponse:
        cards = [self.cards[i] for i in device_ids]
        return dp.ContainerAllocateResponse(
            envs={VISIBLE_DEVICES_ENV: ",".join(device_ids)},
            devices=[
                dp.DeviceSpec(container_path=c.container_path, host_path=str(c.host_path), permissions="rw")
                for c in cards
            ],
        )

    async def register(self) -> None:
        kubelet = self.plugin_dir / KUBELET_SOCKET
        identity = socket_identity(kubelet)
        async with grpc.aio.insecure_channel(f"unix://{kubelet}") as channel:
            await dp_grpc.RegistrationStub(channel).Register(
                dp.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.socket_path.name,
                    resource_name=self.resource,
                    options=dp.DevicePluginOptions(get_preferred_allocation_available=True),
                ),
                timeout=5,
            )
        self.registrations += 1
        self._registered_with = identity
        log.info("vendor plugin registered resource=%s", self.resource)

    async def _dial_self(self) -> None:
        async with grpc.aio.insecure_channel(f"unix://{self.socket_path}") as channel:
            stub = dp_grpc.DevicePluginStub(channel)
            await stub.GetDevicePluginOptions(dp.Empty(), timeout=5)

    async def _watch_kubelet(self) -> None:
        kubelet = self.plugin_dir / KUBELET_SOCKET
        failing = False
        while True:
            await asyncio.sleep(self._watch_interval)
            identity = socket_identity(kubelet)
            if identity is None or identity == self._registered_with:
                continue
            try:
                await self.register()
                failing = False
            except (OSError, grpc.RpcError) as err:
                if not failing:  # one line per outage, not one per retry
                    log.warning("vendor plugin registration failed: %s", err)
                failing = True


def socket_identity(path: Path) -> tuple[int, int] | None:
    """Inode and change time: a re-created socket differs even when its inode is reused."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_ctime_ns
