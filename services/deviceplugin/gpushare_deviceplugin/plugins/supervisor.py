"""Keeps every plugin served and registered.

Polls two things (cheap ``stat`` calls): the kubelet socket's identity, and
each plugin's own socket.  A kubelet socket that appears or is re-created
means the kubelet restarted: every plugin registers again.  A plugin whose
socket vanished (the kubelet wipes the directory on restart) is restarted.
Failures are retried with exponential backoff; one log line per transition.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpushare_common.logging import get_logger
from gpushare_common.retry import Backoff, wait_for_stop

from .plugin import DevicePlugin, inode_of

log = get_logger("deviceplugin.supervisor")


@dataclass(slots=True)
class Retry:
    backoff: Backoff
    next_at: float = 0.0
    failures: int = 0


class Supervisor:
    def __init__(self, plugins: list[DevicePlugin], kubelet_socket: str, poll_s: float = 0.2,
                 backoff_min_s: float = 0.5, backoff_max_s: float = 30.0,
                 on_tick: Callable[[], None] | None = None) -> None:
        self.plugins = plugins
        self.kubelet_socket = kubelet_socket
        self.poll_s = poll_s
        self._min = backoff_min_s
        self._max = backoff_max_s
        self._kubelet: tuple[int, int, int] | None = None
        self._retry = {p.resource: self._fresh_retry() for p in plugins}
        self.kubelet_generations = 0
        self._on_tick = on_tick
        self._first = True

    async def run(self, stop: asyncio.Event) -> None:
        me = asyncio.current_task()
        try:
            while not stop.is_set():
                await self.tick()
                await wait_for_stop(stop, self.poll_s)
                if me is not None and me.cancelling():
                    # a gRPC call in flight may turn our cancellation into its own error
                    raise asyncio.CancelledError
        finally:
            await asyncio.gather(*(p.stop() for p in self.plugins), return_exceptions=True)

    async def tick(self) -> None:
        self._watch_kubelet()
        await asyncio.gather(*(self._keep(p) for p in self.plugins))
        if self._on_tick is not None:
            self._on_tick()

    def _watch_kubelet(self) -> None:
        current = inode_of(self.kubelet_socket)
        first, self._first = self._first, False
        if current == self._kubelet and not first:
            return
        if current is None:
            log.warning("kubelet socket absent; plugins will register when it appears",
                        kubelet=self.kubelet_socket)
        else:
            self.kubelet_generations += 1
            log.info("kubelet socket appeared; registering every plugin",
                     kubelet=self.kubelet_socket, generation=self.kubelet_generations)
        for plugin in self.plugins:
            plugin.unregister()
            self._retry[plugin.resource] = self._fresh_retry()
        self._kubelet = current

    async def _keep(self, plugin: DevicePlugin) -> None:
        retry = self._retry[plugin.resource]
        if time.monotonic() < retry.next_at:
            return
        try:
            if plugin.socket_lost():
                log.warning("plugin socket vanished; restarting", resource=plugin.resource,
                            socket=plugin.socket_path)
                plugin.restarts_inc()
                await plugin.stop()
            if plugin.state == "stopped":
                await plugin.start()
            registering = plugin.state == "serving" and self._kubelet is not None
            if registering and not await plugin.register(self.kubelet_socket):
                raise ConnectionError(plugin.last_error)
        except Exception as err:
            self._failed(plugin, retry, err)
            return
        retry.failures = 0
        retry.backoff.reset()

    def _fresh_retry(self) -> Retry:
        return Retry(Backoff(self._min, self._max, jitter=0.0))

    def _failed(self, plugin: DevicePlugin, retry: Retry, err: Exception) -> None:
        delay = retry.backoff.next()
        retry.failures += 1
        retry.next_at = time.monotonic() + delay
        if retry.failures == 1 or delay >= self._max:
            log.warning("plugin not ready; retrying with backoff", resource=plugin.resource,
                        state=plugin.state, error=str(err) or repr(err),
                        failures=retry.failures, retry_in_s=round(delay, 2))
