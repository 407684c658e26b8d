"""gRPC face of the plugins: serve v1beta1 DevicePlugin on a unix socket, Register with the kubelet.

The only module (with :mod:`.vendor`) that touches ``grpc``.  Plugin logic
raises :class:`~gpushare_deviceplugin.errors.PluginError`; it becomes a gRPC
status here, and any other exception becomes ``INTERNAL`` with a log line,
never a crashed server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

import grpc
from gpushare_common.adapters.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from gpushare_common.adapters.kubeletapi import deviceplugin_v1beta1_pb2_grpc as _pbg
from gpushare_common.logging import get_logger

from ..devices import DeviceBoard
from ..errors import ErrorCode, PluginError
from ..handlers.base import Annotations, PreferredRequest

API_VERSION = "v1beta1"
pbg: Any = _pbg  # generated stubs carry no types
log = get_logger("deviceplugin.grpc")

_STATUS: dict[ErrorCode, grpc.StatusCode] = {
    "invalid-argument": grpc.StatusCode.INVALID_ARGUMENT,
    "not-found": grpc.StatusCode.NOT_FOUND,
    "failed-precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
}


class KubeletError(Exception):
    """Registration failed: the kubelet is absent, or it refused the plugin."""

    def __init__(self, socket: str, resource: str, reason: str) -> None:
        self.socket = socket
        self.resource = resource
        self.reason = reason
        super().__init__(f"register {resource} at {socket}: {reason}")


class PluginHandlers(Protocol):
    """What the servicer calls; implemented by the plugin object."""

    resource: str
    board: DeviceBoard
    resend_s: float

    def allocate(self, containers: Sequence[Sequence[str]]) -> list[Annotations]: ...

    def preferred(self, requests: Sequence[PreferredRequest]) -> list[list[str]]: ...

    def watch_opened(self, delta: int) -> None: ...

    def numa_of(self, device_id: str) -> int | None: ...


def _device(device_id: str, health: str, numa: int | None) -> pb.Device:
    if numa is None:
        return pb.Device(ID=device_id, health=health)
    return pb.Device(ID=device_id, health=health, topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=numa)]))


def list_response(board: DeviceBoard, numa: Callable[[str], int | None] = lambda _: None
                  ) -> pb.ListAndWatchResponse:
    """The full device list; a device whose NUMA node is known carries it (TopologyInfo)."""
    return pb.ListAndWatchResponse(
        devices=[_device(i, h, numa(i)) for i, h in sorted(board.devices().items())]
    )


class _Servicer(pbg.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, plugin: PluginHandlers, closing: asyncio.Event) -> None:
        self._plugin = plugin
        self._closing = closing

    async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return pb.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        board = self._plugin.board
        self._plugin.watch_opened(1)
        try:
            while not self._closing.is_set():
                version = board.version
                yield list_response(board, self._plugin.numa_of)
                await board.wait_newer(version, self._plugin.resend_s)
        finally:
            self._plugin.watch_opened(-1)

    async def Allocate(self, request: Any, context: Any) -> Any:
        containers = [list(c.devices_ids) for c in request.container_requests]
        result = await _guard(context, self._plugin.resource, "Allocate",
                              lambda: self._plugin.allocate(containers))
        return pb.AllocateResponse(
            container_responses=[pb.ContainerAllocateResponse(annotations=a) for a in result]
        )

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        requests = [
            PreferredRequest(tuple(c.available_deviceIDs), tuple(c.must_include_deviceIDs),
                             int(c.allocation_size))
            for c in request.container_requests
        ]
        result = await _guard(context, self._plugin.resource, "GetPreferredAllocation",
                              lambda: self._plugin.preferred(requests))
        return pb.PreferredAllocationResponse(
            container_responses=[pb.ContainerPreferredAllocationResponse(deviceIDs=d)
                                 for d in result]
        )

    async def PreStartContainer(self, request: Any, context: Any) -> Any:
        return pb.PreStartContainerResponse()


async def _guard(context: Any, resource: str, call: str, work: Callable[[], Any]) -> Any:
    try:
        return work()
    except PluginError as err:
        log.warning("request refused", resource=resource, call=call, reason=err.message)
        await context.abort(_STATUS[err.code], str(err))
    except Exception as err:  # a bug must not take the plugin down
        log.exception("request failed", resource=resource, call=call)
        await context.abort(grpc.StatusCode.INTERNAL, f"{resource}: internal error {err!r}")


class PluginServer:
    """One gRPC server on one unix socket for one plugin."""

    def __init__(self, socket_path: str, plugin: PluginHandlers) -> None:
        self.socket_path = socket_path
        self._plugin = plugin
        self._closing = asyncio.Event()
        self._server: Any = None

    async def start(self) -> None:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        pbg.add_DevicePluginServicer_to_server(_Servicer(self._plugin, self._closing), server)
        if server.add_insecure_port(f"unix://{self.socket_path}") == 0:
            raise OSError(f"cannot listen on {self.socket_path}")
        await server.start()
        self._server = server

    async def stop(self, grace_s: float = 0.5) -> None:
        self._closing.set()
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace_s)


async def dial(socket_path: str, timeout_s: float = 5.0) -> None:
    """Prove a plugin socket answers (GetDevicePluginOptions); ConnectionError when it does not."""
    try:
        async with grpc.aio.insecure_channel(f"unix://{socket_path}") as channel:
            stub = pbg.DevicePluginStub(channel)
            await stub.GetDevicePluginOptions(pb.Empty(), timeout=timeout_s, wait_for_ready=True)
    except grpc.aio.AioRpcError as err:
        raise ConnectionError(f"plugin socket {socket_path} does not answer: {err.code().name} "
                              f"{err.details() or ''}".strip()) from None


async def register(kubelet_socket: str, endpoint: str, resource: str, timeout_s: float = 5.0
                   ) -> float:
    """Register one plugin; returns the seconds it took, raises :class:`KubeletError`."""
    started = time.perf_counter()
    request = pb.RegisterRequest(
        version=API_VERSION, endpoint=endpoint, resource_name=resource,
        options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
    )
    try:
        async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
            await pbg.RegistrationStub(channel).Register(request, timeout=timeout_s)
    except grpc.aio.AioRpcError as err:
        reason = f"{err.code().name}: {err.details()}"
        raise KubeletError(kubelet_socket, resource, reason) from None
    return time.perf_counter() - started
