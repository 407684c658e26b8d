"""The kubelet's side of the driver: plugin registration, the DRA service, the health stream.

The only module that touches ``grpc``. Two unix sockets: the registration socket in the
kubelet's ``plugins_registry`` (``Registration``: GetInfo names the driver, its DRA socket
and ``v1.DRAPlugin``), and the DRA socket (``DRAPlugin`` v1 and ``DRAResourceHealth``
v1alpha1). A malformed request is ``INVALID_ARGUMENT``; a claim that cannot be prepared gets
its error in the response, as the kubelet expects; any other exception is ``INTERNAL`` with
a log line, never a crashed server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc
from gpushare_common.adapters.kubeletapi import dra_health_v1alpha1_pb2 as hpb
from gpushare_common.adapters.kubeletapi import dra_health_v1alpha1_pb2_grpc as _hpbg
from gpushare_common.adapters.kubeletapi import dra_v1_pb2 as pb
from gpushare_common.adapters.kubeletapi import dra_v1_pb2_grpc as _pbg
from gpushare_common.adapters.kubeletapi import pluginregistration_v1_pb2 as rpb
from gpushare_common.adapters.kubeletapi import pluginregistration_v1_pb2_grpc as _rpbg
from gpushare_common.logging import get_logger

from ..claims import ClaimRef
from ..prepare import RequestError
from ..state import PreparedClaim

pbg: Any = _pbg  # generated stubs carry no types
hpbg: Any = _hpbg
rpbg: Any = _rpbg
log = get_logger("dra.grpc")
PLUGIN_TYPE = "DRAPlugin"
SERVICE_VERSION = "v1.DRAPlugin"


class Driver(Protocol):
    """What the servicers call."""

    name: str
    endpoint: str

    async def prepare(self, refs: list[ClaimRef]) -> dict[str, PreparedClaim | str]: ...
    async def unprepare(self, refs: list[ClaimRef]) -> dict[str, str]: ...
    def device_health(self) -> tuple[int, list[tuple[str, str, bool]]]: ...
    async def health_changed(self, version: int, within_s: float) -> None: ...
    def registration(self, registered: bool, error: str) -> None: ...


def refs_of(request: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims]


async def _guarded(context: Any, call: str, work: Callable[[], Awaitable[Any]]) -> Any:
    try:
        return await work()
    except RequestError as err:
        log.warning("request refused", call=call, reason=str(err))
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{call}: {err}")
    except Exception as err:  # a bug must not take the driver down
        log.exception("request failed", call=call)
        await context.abort(grpc.StatusCode.INTERNAL, f"{call}: internal error {err!r}")


def prepare_response(results: dict[str, PreparedClaim | str]) -> Any:
    claims = {}
    for uid, result in results.items():
        if isinstance(result, str):
            claims[uid] = pb.NodePrepareResourceResponse(error=result)
            continue
        devices = [pb.Device(request_names=list(d.requests), pool_name=d.pool, device_name=d.device,
                             cdi_device_ids=list(d.cdi_ids)) for d in result.devices]
        claims[uid] = pb.NodePrepareResourceResponse(devices=devices)
    return pb.NodePrepareResourcesResponse(claims=claims)


class _Dra(pbg.DRAPluginServicer):  # type: ignore[misc]
    def __init__(self, driver: Driver) -> None:
        self._driver = driver

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        results = await _guarded(context, "NodePrepareResources", lambda: self._driver.prepare(refs_of(request)))
        return prepare_response(results)

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        results = await _guarded(context, "NodeUnprepareResources",
                                 lambda: self._driver.unprepare(refs_of(request)))
        return pb.NodeUnprepareResourcesResponse(
            claims={uid: pb.NodeUnprepareResourceResponse(error=e) for uid, e in results.items()})


class _Health(hpbg.DRAResourceHealthServicer):  # type: ignore[misc]
    def __init__(self, driver: Driver, closing: asyncio.Event, resend_s: float) -> None:
        self._driver = driver
        self._closing = closing
        self._resend_s = resend_s

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        while not self._closing.is_set():
            version, devices = self._driver.device_health()
            now = int(time.time())
            yield hpb.NodeWatchResourcesResponse(devices=[
                hpb.DeviceHealth(device=hpb.DeviceIdentifier(pool_name=pool, device_name=name),
                                 health=hpb.HEALTHY if ok else hpb.UNHEALTHY, last_updated_time=now)
                for pool, name, ok in devices])
            await self._driver.health_changed(version, self._resend_s)


class _Registration(rpbg.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, driver: Driver) -> None:
        self._driver = driver

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return rpb.PluginInfo(type=PLUGIN_TYPE, name=self._driver.name, endpoint=self._driver.endpoint,
                              supported_versions=[SERVICE_VERSION])

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self._driver.registration(request.plugin_registered, request.error)
        return rpb.RegistrationStatusResponse()


def socket_identity(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_ctime_ns


class SocketServer:
    """One gRPC server on one unix socket; ``stop()`` is safe twice and removes the socket
    only when it is still the one this server created."""

    def __init__(self, path: str, add: Callable[[Any], None]) -> None:
        self.path = path
        self._add = add
        self._server: Any = None
        self.identity: tuple[int, int] | None = None

    async def start(self) -> None:
        await self.stop()
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        self._add(server)
        if server.add_insecure_port(f"unix://{self.path}") == 0:
            raise OSError(f"cannot listen on {self.path}")
        await server.start()
        self._server, self.identity = server, socket_identity(self.path)

    def lost(self) -> bool:
        return self._server is not None and socket_identity(self.path) != self.identity

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        await server.stop(0.5)
        if socket_identity(self.path) == self.identity:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def dra_server(path: str, driver: Driver, closing: asyncio.Event, resend_s: float) -> SocketServer:
    def add(server: Any) -> None:
        pbg.add_DRAPluginServicer_to_server(_Dra(driver), server)
        hpbg.add_DRAResourceHealthServicer_to_server(_Health(driver, closing, resend_s), server)

    return SocketServer(path, add)


def registration_server(path: str, driver: Driver) -> SocketServer:
    return SocketServer(path, lambda server: rpbg.add_RegistrationServicer_to_server(_Registration(driver), server))


async def dial(path: str, timeout_s: float = 5.0) -> None:
    """Prove the registration socket answers (GetInfo), as the kubelet will call it."""
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        await rpbg.RegistrationStub(channel).GetInfo(rpb.InfoRequest(), timeout=timeout_s, wait_for_ready=True)
