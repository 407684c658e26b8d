"""Keeps every plugin served and registered.

Polls two things (cheap ``stat`` calls): the kubelet socket's identity, and
each plugin's own socket.  A kubelet socket that appears or is re-created
means the kubelet restarted: every plugin registers again, at once.  A plugin
whose socket vanished (the kubelet wipes the directory on restart) is
restarted.  Each plugin is kept by its own supervised loop
(:class:`~gpushare_common.retry.Supervised`): failures are retried with
backoff, one log line per transition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gpushare_common.logging import get_logger
from gpushare_common.retry import Backoff, Supervised, wait_for_stop

from .plugin import DevicePlugin, inode_of

log = get_logger("deviceplugin.supervisor")


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
        self._loops: dict[str, Supervised] = {}
        self.kubelet_generations = 0
        self._on_tick = on_tick
        self._first = True

    async def run(self, stop: asyncio.Event) -> None:
        self._loops = {p.resource: Supervised(f"serve and register {p.resource}", stop, Backoff(self._min, self._max),
                                              every_s=self.poll_s, resource=p.resource)
                       for p in self.plugins}  # fmt: skip
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._follow_kubelet(stop), name="kubelet socket")
                for plugin in self.plugins:
                    group.create_task(self._keep_serving(plugin, self._loops[plugin.resource]),
                                      name=f"plugin {plugin.resource}")
        finally:
            await asyncio.gather(*(p.stop() for p in self.plugins), return_exceptions=True)

    async def _follow_kubelet(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._watch_kubelet()
            if self._on_tick is not None:
                self._on_tick()
            await wait_for_stop(stop, self.poll_s)

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
        self._kubelet = current
        for plugin in self.plugins:
            plugin.unregister()
            self._loops[plugin.resource].restart()

    async def _keep_serving(self, plugin: DevicePlugin, loop: Supervised) -> None:
        me = asyncio.current_task()
        async for keeping in loop:
            try:
                await self._keep(plugin)
            except OSError as err:  # its socket, its server, or the kubelet refused it
                keeping.failed(err)
            else:
                keeping.progress()
            if me is not None and me.cancelling():
                raise asyncio.CancelledError  # a gRPC call in flight turned our cancellation into its error

    async def _keep(self, plugin: DevicePlugin) -> None:
        if plugin.socket_lost():
            log.warning("plugin socket vanished; restarting", resource=plugin.resource,
                        socket=plugin.socket_path)
            plugin.restarts_inc()
            await plugin.stop()
        if plugin.state == "stopped":
            await plugin.start()
        registering = plugin.state == "serving" and self._kubelet is not None
        if registering and not await plugin.register(self.kubelet_socket):
            raise ConnectionError(f"the kubelet refused the registration: {plugin.last_error}")
