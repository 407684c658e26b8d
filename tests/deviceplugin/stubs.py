"""A kubelet stand-in and a vendor device plugin stand-in, both real gRPC servers.

``KubeletStub`` serves ``Registration`` on ``kubelet.sock`` and, like the
kubelet, dials every registered plugin back, reads its options and keeps one
``ListAndWatch`` stream open per resource.  ``VendorPluginStub`` serves a
vendor's ``DevicePlugin`` (e.g. ``nvidia.com/gpu``) whose list a test changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from gpushare_common.adapters.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from gpushare_common.adapters.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pbg


@dataclass
class Registered:
    resource: str
    endpoint: str
    channel: Any
    stub: Any
    watch: asyncio.Task[None] | None = None
    lists: list[dict[str, str]] = field(default_factory=list)
    received_at: list[float] = field(default_factory=list)


class KubeletStub(pbg.RegistrationServicer):
    def __init__(self, plugin_dir: str) -> None:
        self.plugin_dir = plugin_dir
        self.socket = os.path.join(plugin_dir, "kubelet.sock")
        self.plugins: dict[str, Registered] = {}
        self.registrations: list[str] = []
        self.changed = asyncio.Condition()
        self._server: Any = None

    async def start(self) -> None:
        self._server = grpc.aio.server()
        pbg.add_RegistrationServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        await self._server.start()

    async def stop(self) -> None:
        for plugin in self.plugins.values():
            await self._close(plugin)
        self.plugins.clear()
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)

    async def restart(self, wipe_plugin_sockets: bool = False) -> None:
        """What a kubelet restart looks like from a plugin: a new kubelet.sock."""
        await self.stop()
        if wipe_plugin_sockets:
            for name in os.listdir(self.plugin_dir):
                if name.endswith(".sock"):
                    os.unlink(os.path.join(self.plugin_dir, name))
        self.registrations.clear()
        await self.start()

    async def _close(self, plugin: Registered) -> None:
        if plugin.watch is not None:
            plugin.watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await plugin.watch
        await plugin.channel.close()

    async def Register(self, request: Any, context: Any) -> Any:
        if request.version != "v1beta1":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unsupported version")
        old = self.plugins.pop(request.resource_name, None)
        if old is not None:
            await self._close(old)
        channel = grpc.aio.insecure_channel(
            f"unix://{os.path.join(self.plugin_dir, request.endpoint)}")
        plugin = Registered(request.resource_name, request.endpoint, channel,
                            pbg.DevicePluginStub(channel))
        self.plugins[request.resource_name] = plugin
        self.registrations.append(request.resource_name)
        plugin.watch = asyncio.get_running_loop().create_task(self._watch(plugin))
        async with self.changed:
            self.changed.notify_all()
        return pb.Empty()

    async def _watch(self, plugin: Registered) -> None:
        await plugin.stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for response in plugin.stub.ListAndWatch(pb.Empty()):
                plugin.lists.append({d.ID: d.health for d in response.devices})
                plugin.received_at.append(time.perf_counter())
                async with self.changed:
                    self.changed.notify_all()

    def latest(self, resource: str) -> dict[str, str] | None:
        plugin = self.plugins.get(resource)
        return plugin.lists[-1] if plugin is not None and plugin.lists else None

    async def wait_for(self, check: Callable[[], bool], timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout), self.changed:
            await self.changed.wait_for(check)

    async def wait_list(self, resource: str, check: Callable[[dict[str, str]], bool],
                        timeout: float = 5.0) -> dict[str, str]:
        def ready() -> bool:
            latest = self.latest(resource)
            return latest is not None and check(latest)

        await self.wait_for(ready, timeout)
        return self.latest(resource) or {}

    async def allocate(self, resource: str, *containers: list[str]) -> Any:
        request = pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=ids) for ids in containers])
        return await self.plugins[resource].stub.Allocate(request, timeout=5)

    async def preferred(self, resource: str, available: list[str], must: list[str],
                        size: int) -> list[str]:
        request = pb.PreferredAllocationRequest(container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must,
                allocation_size=size)])
        response = await self.plugins[resource].stub.GetPreferredAllocation(request, timeout=5)
        return list(response.container_responses[0].deviceIDs)


class VendorPluginStub(pbg.DevicePluginServicer):
    """A vendor device plugin's ListAndWatch, with a list the test controls."""

    def __init__(self, socket: str, devices: dict[str, str]) -> None:
        self.socket = socket
        self.devices = dict(devices)
        self._changed = asyncio.Event()
        self._server: Any = None

    async def start(self) -> None:
        self._server = grpc.aio.server()
        pbg.add_DevicePluginServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)

    def set_devices(self, devices: dict[str, str]) -> None:
        self.devices = dict(devices)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def ListAndWatch(self, request: Any, context: Any) -> Any:
        while True:
            changed = self._changed
            yield pb.ListAndWatchResponse(
                devices=[pb.Device(ID=i, health=h) for i, h in self.devices.items()])
            await changed.wait()
