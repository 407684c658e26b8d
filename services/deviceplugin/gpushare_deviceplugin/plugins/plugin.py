"""One device plugin: a resource name, its logic, its socket, its registration state."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

from gpushare_common.logging import get_logger

from ..adapters.kubelet import KubeletError, PluginServer, dial, register
from ..errors import PluginError
from ..handlers.base import Annotations, PluginLogic, PreferredRequest
from .metrics import PluginMetrics

T = TypeVar("T")
State = Literal["stopped", "serving", "registered"]
log = get_logger("deviceplugin.plugin")


def socket_name(resource: str) -> str:
    """``gpushare/share-gpu-4`` -> ``gpushare-share-gpu-4.sock``."""
    return resource.replace("/", "-").replace(".", "-") + ".sock"


def inode_of(path: str) -> tuple[int, int, int] | None:
    """A file's identity: device, inode and change time (inode numbers get reused)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino, stat.st_ctime_ns


class DevicePlugin:
    """``start()`` serves, dials itself and registers; ``stop()`` is safe twice."""

    def __init__(self, logic: PluginLogic, plugin_dir: str, metrics: PluginMetrics,
                 resend_s: float = 60.0) -> None:
        self.logic = logic
        self.resource = logic.resource
        self.board = logic.board
        self.resend_s = resend_s
        self.endpoint = socket_name(logic.resource)
        self.socket_path = os.path.join(plugin_dir, self.endpoint)
        self.state: State = "stopped"
        self.last_error = ""
        self.registered_at = 0.0
        self.watchers = 0
        self._metrics = metrics
        self._server: PluginServer | None = None
        self._inode: tuple[int, int, int] | None = None
        self._log = log.bind(resource=self.resource)
        # read at scrape time, so /metrics never lags behind the device list
        metrics.devices.labels(self.resource, "Healthy").set_function(
            lambda: self.board.counts()[0])
        metrics.devices.labels(self.resource, "Unhealthy").set_function(
            lambda: self.board.counts()[1])
        metrics.registered.labels(self.resource).set_function(
            lambda: 1.0 if self.state == "registered" else 0.0)

    # --- kubelet-facing calls (the gRPC servicer calls these) -----------------

    def allocate(self, containers: Sequence[Sequence[str]]) -> list[Annotations]:
        with self._metrics.allocate_seconds.labels(self.resource).time():
            return self._count("Allocate", lambda: self.logic.allocate(containers))

    def preferred(self, requests: Sequence[PreferredRequest]) -> list[list[str]]:
        return self._count("GetPreferredAllocation", lambda: self.logic.preferred(requests))

    def _count(self, call: str, work: Callable[[], T]) -> T:
        try:
            result = work()
        except PluginError:
            self._metrics.calls.labels(self.resource, call, "refused").inc()
            raise
        self._metrics.calls.labels(self.resource, call, "ok").inc()
        return result

    def watch_opened(self, delta: int) -> None:
        self.watchers += delta
        self._log.info("ListAndWatch opened" if delta > 0 else "ListAndWatch closed",
                       watchers=self.watchers)
        self._metrics.watchers.labels(self.resource).set(self.watchers)

    def devices(self) -> dict[str, str]:
        return dict(self.board.devices())

    def numa_of(self, device_id: str) -> int | None:
        return self.logic.numa_of(device_id)

    # --- lifecycle ------------------------------------------------------------

    async def start(self, kubelet_socket: str | None = None) -> None:
        """Serve on a fresh socket and prove it answers; register when a kubelet is given."""
        await self.stop()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        server = PluginServer(self.socket_path, self)
        await server.start()
        self._server = server
        self._inode = inode_of(self.socket_path)
        await dial(self.socket_path)
        self.state = "serving"
        self._log.info("plugin serving", socket=self.socket_path)
        if kubelet_socket is not None:
            await self.register(kubelet_socket)

    async def register(self, kubelet_socket: str) -> bool:
        try:
            took = await register(kubelet_socket, self.endpoint, self.resource)
        except KubeletError as err:
            self.last_error = err.reason
            self._metrics.registrations.labels(self.resource, "failed").inc()
            if self.state == "registered":
                self.state = "serving"
            return False
        self.state, self.last_error, self.registered_at = "registered", "", time.time()
        self._metrics.registrations.labels(self.resource, "ok").inc()
        self._log.info("plugin registered", kubelet=kubelet_socket, took_ms=round(took * 1e3, 2))
        return True

    def unregister(self) -> None:
        """The kubelet went away: a later registration is needed."""
        if self.state == "registered":
            self.state = "serving"

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop()
            if self._inode is not None and inode_of(self.socket_path) == self._inode:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.socket_path)
            self._log.info("plugin stopped")
        self._inode = None
        self.state = "stopped"

    def restarts_inc(self) -> None:
        self._metrics.restarts.labels(self.resource).inc()

    def socket_lost(self) -> bool:
        return self.state != "stopped" and inode_of(self.socket_path) != self._inode

    def status(self) -> dict[str, Any]:
        healthy, unhealthy = self.board.counts()
        return {
            "resource": self.resource, "socket": self.socket_path, "state": self.state,
            "registered": self.state == "registered", "healthy": healthy,
            "unhealthy": unhealthy, "watchers": self.watchers, "last_error": self.last_error,
            "logic": self.logic.status(),
        }
