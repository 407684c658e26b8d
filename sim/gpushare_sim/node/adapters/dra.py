"""The kubelet's DRA plugin side: the plugin watcher and the client of each driver.

The watcher follows ``<node dir>/plugins_registry``: for every socket that appears (or is
created again) it calls ``Registration.GetInfo``; a ``DRAPlugin`` that offers
``v1.DRAPlugin`` on an endpoint that exists is registered under its driver name and told
so (``NotifyRegistrationStatus``); anything else is told why not. A socket that goes away
takes its driver with it. ``prepare``/``unprepare`` call the driver's
``NodePrepareResources``/``NodeUnprepareResources`` over its own socket.

As the kubelet does since 1.33, several instances of one driver may be registered at once,
each under its own sockets (a rolling update: the new DaemonSet pod starts before the old one
stops): calls go to the instance registered last, and when its socket goes the one before
takes over.

Device health (``ResourceHealthStatus``): the instance in use of each driver is asked for
``DRAResourceHealth.NodeWatchResources``; what it streams goes into :attr:`DraPlugins.health`
and the devices that changed to ``on_health`` (the kubelet writes the status of the pods
using them again). A driver that does not serve the stream is not asked again; one whose
stream ends has its devices' health cleared (Unknown) and is asked again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from gpushare_common.adapters.kubeletapi import dra_health_v1alpha1_pb2 as hpb
from gpushare_common.adapters.kubeletapi import dra_health_v1alpha1_pb2_grpc as hpb_grpc
from gpushare_common.adapters.kubeletapi import dra_v1_pb2 as pb
from gpushare_common.adapters.kubeletapi import dra_v1_pb2_grpc as pb_grpc
from gpushare_common.adapters.kubeletapi import pluginregistration_v1_pb2 as rpb
from gpushare_common.adapters.kubeletapi import pluginregistration_v1_pb2_grpc as rpb_grpc

from gpushare_sim.fakegpu.plugin import socket_identity
from gpushare_sim.node.health import HEALTHY, UNHEALTHY, UNKNOWN, DeviceHealth, DeviceKey

log = logging.getLogger("gpushare_sim.node.dra")
PLUGIN_TYPE = "DRAPlugin"
SERVICE = "v1.DRAPlugin"
RPC_TIMEOUT = 10.0


class DraError(Exception):
    """A driver is missing or failed a call."""


@dataclass(frozen=True, slots=True)
class ClaimKey:
    namespace: str
    name: str
    uid: str


@dataclass
class _Driver:
    name: str
    endpoint: str
    registration: Path
    identity: tuple[int, int] | None
    channel: grpc.aio.Channel
    stub: Any

    async def close(self) -> None:
        await self.channel.close()


def check_info(info: Any) -> str:
    """Why a plugin's GetInfo answer cannot be registered ("" when it can)."""
    if info.type != PLUGIN_TYPE:
        return f"plugin type {info.type!r} is not {PLUGIN_TYPE}"
    if SERVICE not in info.supported_versions:
        return f"supported versions {list(info.supported_versions)} do not include {SERVICE}"
    if not info.name or "/" in info.name:
        return f"driver name {info.name!r} is not a DNS subdomain"
    if not info.endpoint.startswith("/") or not Path(info.endpoint).exists():
        return f"endpoint {info.endpoint!r} is not an existing socket"
    return ""


HealthHook = Callable[[set[DeviceKey]], Awaitable[None]]
HEALTH = {hpb.HEALTHY: HEALTHY, hpb.UNHEALTHY: UNHEALTHY}
HEALTH_RETRY_S = 1.0


class DraPlugins:
    def __init__(self, registry_dir: Path, poll_s: float = 0.2) -> None:
        self.registry_dir = registry_dir
        self.poll_s = poll_s
        self.instances: dict[str, list[_Driver]] = {}  # driver -> its instances, the newest last
        self.refused: dict[str, str] = {}  # socket -> why
        self.health = DeviceHealth()
        self.on_health: HealthHook | None = None
        self._watching: dict[str, tuple[str, asyncio.Task[None]]] = {}  # driver -> (endpoint, its stream)
        self._no_health: set[str] = set()  # endpoints that serve no health stream

    @property
    def drivers(self) -> dict[str, _Driver]:
        """Each driver's instance that calls go to (the newest registered)."""
        return {name: found[-1] for name, found in self.instances.items() if found}

    def registered(self) -> list[str]:
        return sorted(self.drivers)

    def endpoints(self, name: str) -> list[str]:
        """The DRA sockets of a driver's registered instances, the one in use last."""
        return [d.endpoint for d in self.instances.get(name, [])]

    async def run(self, stop: asyncio.Event, after_scan: Callable[[], Awaitable[None]] | None = None) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        try:
            while not stop.is_set():
                await self.scan()
                self._watch_health()
                if after_scan is not None:
                    await after_scan()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll_s)
        finally:
            await self.close()

    async def scan(self) -> None:
        sockets = {p: socket_identity(p) for p in self.registry_dir.glob("*.sock") if not p.name.startswith(".")}
        for name, found in list(self.instances.items()):
            for driver in [d for d in found if sockets.get(d.registration) != d.identity]:
                log.info("DRA plugin socket gone driver=%s endpoint=%s", name, driver.endpoint)
                found.remove(driver)
                await driver.close()
            if not found:
                del self.instances[name]
        known = {d.registration for found in self.instances.values() for d in found}
        for path, identity in sockets.items():
            if path not in known and self.refused.get(str(path)) != str(identity):
                await self.register(path, identity)

    async def register(self, path: Path, identity: tuple[int, int] | None) -> None:
        try:
            async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
                stub = rpb_grpc.RegistrationStub(channel)
                info = await stub.GetInfo(rpb.InfoRequest(), timeout=RPC_TIMEOUT)
                problem = check_info(info)
                await stub.NotifyRegistrationStatus(
                    rpb.RegistrationStatus(plugin_registered=not problem, error=problem), timeout=RPC_TIMEOUT)
        except grpc.RpcError as err:
            log.warning("DRA plugin registration failed socket=%s: %s", path, err.code())
            return
        if problem:
            log.warning("DRA plugin refused socket=%s: %s", path, problem)
            self.refused[str(path)] = str(identity)
            return
        found = self.instances.setdefault(info.name, [])
        for old in [d for d in found if d.registration == path or d.endpoint == info.endpoint]:
            found.remove(old)  # the same instance serving again
            await old.close()
        channel = grpc.aio.insecure_channel(f"unix://{info.endpoint}")
        found.append(_Driver(info.name, info.endpoint, path, identity, channel, pb_grpc.DRAPluginStub(channel)))
        log.info("DRA plugin registered driver=%s endpoint=%s instances=%d", info.name, info.endpoint, len(found))

    def _driver(self, name: str) -> _Driver:
        driver = self.drivers.get(name)
        if driver is None:
            raise DraError(f"DRA driver {name} is not registered with this kubelet")
        return driver

    async def prepare(self, name: str, claims: list[ClaimKey]) -> dict[str, Any]:
        """Per claim UID: the driver's NodePrepareResourceResponse."""
        request = pb.NodePrepareResourcesRequest(
            claims=[pb.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims])
        try:
            reply = await self._driver(name).stub.NodePrepareResources(request, timeout=RPC_TIMEOUT)
        except grpc.RpcError as err:
            raise DraError(f"NodePrepareResources of {name}: {err.code().name}: {err.details()}") from None
        missing = [c.uid for c in claims if c.uid not in reply.claims]
        if missing:
            raise DraError(f"NodePrepareResources of {name}: no answer for claims {missing}")
        return dict(reply.claims)

    async def unprepare(self, name: str, claims: list[ClaimKey]) -> dict[str, str]:
        request = pb.NodeUnprepareResourcesRequest(
            claims=[pb.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims])
        try:
            reply = await self._driver(name).stub.NodeUnprepareResources(request, timeout=RPC_TIMEOUT)
        except grpc.RpcError as err:
            raise DraError(f"NodeUnprepareResources of {name}: {err.code().name}: {err.details()}") from None
        return {uid: r.error for uid, r in reply.claims.items()}

    # --- device health ------------------------------------------------------------

    def _watch_health(self) -> None:
        """One health stream per driver, from its instance in use."""
        current = {name: driver.endpoint for name, driver in self.drivers.items()}
        for name, (endpoint, task) in list(self._watching.items()):
            if current.get(name) != endpoint or task.done():
                task.cancel()
                del self._watching[name]
        for name, endpoint in current.items():
            if name not in self._watching and endpoint not in self._no_health:
                task = asyncio.create_task(self._follow_health(name, endpoint), name=f"dra-health-{name}")
                self._watching[name] = (endpoint, task)

    async def _follow_health(self, name: str, endpoint: str) -> None:
        try:
            async with grpc.aio.insecure_channel(f"unix://{endpoint}") as channel:
                stream = hpb_grpc.DRAResourceHealthStub(channel).NodeWatchResources(hpb.NodeWatchResourcesRequest())
                async for reply in stream:
                    devices = [(d.device.pool_name, d.device.device_name, HEALTH.get(d.health, UNKNOWN))
                               for d in reply.devices]
                    await self._health_changed(self.health.update(name, devices))
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.info("DRA driver serves no device health driver=%s", name)
                self._no_health.add(endpoint)
                return
            log.info("DRA device health stream ended driver=%s: %s", name, err.code().name)
        except asyncio.CancelledError:  # another instance took over, or the kubelet stops
            self.health.clear(name)
            raise
        await self._health_changed(self.health.clear(name))
        await asyncio.sleep(HEALTH_RETRY_S)  # then the next scan asks again

    async def _health_changed(self, changed: set[DeviceKey]) -> None:
        if changed and self.on_health is not None:
            await self.on_health(changed)

    async def close(self) -> None:
        for _, task in self._watching.values():
            task.cancel()
        await asyncio.gather(*(task for _, task in self._watching.values()), return_exceptions=True)
        self._watching.clear()
        for found in self.instances.values():
            for driver in found:
                await driver.close()
        self.instances.clear()
