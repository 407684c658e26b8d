"""Lifecycle of the kmod-bridge: connect NATS, load the watch set, serve commands, link the kernel.

Order matters: the watch set is read back from its bucket before the kernel
link starts, so the first registration already re-sends it.

- Consumes: kmod commands (request/reply), the kernel's notices (netlink, or
  the simulated kernel's socket).
- Publishes: owner-backs (stream, in the kernel's order, retried until stored);
  the watch set (``kmod`` bucket).
- Runs: owner-backs, start (NATS, then kernel link and resolver); HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from gpushare_common import events
from gpushare_common.bus import BusError, Transient
from gpushare_common.logging import get_logger
from gpushare_common.retry import retry
from gpushare_common.service import ServiceBase
from gpushare_common.settings import CommonSettings
from gpushare_common.subjects import KMOD_OPS
from prometheus_client import CollectorRegistry

from . import protocol
from .adapters.containerd import ContainerdSource
from .adapters.procfs import CgroupSource, cgroup_of, host_pidns, pidns_of
from .adapters.simsocket import SimTransport
from .bridge import Bridge
from .link import KernelLink, LinkSettings
from .metrics import BridgeMetrics
from .resolver import ContainerSource, Resolver
from .settings import KmodBridgeSettings
from .status import KmodBridgeStatus
from .transport import Transport
from .watchset import WatchSet

SERVICE = "kmod-bridge"
log = get_logger(SERVICE)


def build_transport(settings: KmodBridgeSettings) -> Transport:
    if settings.transport == "sim":
        return SimTransport(settings.sim_socket)
    from .adapters.netlink import NetlinkTransport  # pyroute2 (12 MB) only where the module is

    return NetlinkTransport(settings.netlink_unit)


def build_sources(settings: KmodBridgeSettings) -> list[ContainerSource]:
    sources: list[ContainerSource] = []
    if "cgroup" in settings.sources:
        sources.append(CgroupSource(settings.cgroup_pattern, settings.proc_root))
    if "containerd" in settings.sources:
        sources.append(ContainerdSource(settings.containerd_address, settings.containerd_namespaces))
    return sources


def filter_config(settings: KmodBridgeSettings) -> protocol.FilterConfig | None:
    if not settings.ioctl_types and not settings.ioctl_majors:
        return None
    return protocol.FilterConfig(settings.ioctl_types, settings.ioctl_majors)


class Service(ServiceBase):
    """One node's bridge between the kernel module and NATS; ``transport``, ``sources``: the
    kernel link and the container sources (tests pass their own)."""

    status_model = KmodBridgeStatus

    def __init__(self, common: CommonSettings, settings: KmodBridgeSettings,
                 transport: Transport | None = None,
                 sources: Sequence[ContainerSource] | None = None,
                 registry: CollectorRegistry | None = None, stop: asyncio.Event | None = None) -> None:
        super().__init__(SERVICE, common.http, "nats", "kernel", stop=stop, registry=registry)
        self.common = common
        self.settings = settings
        self.node = common.node.require()
        self.bus = self.skeleton.bus(common.nats, self.node)
        self.metrics = BridgeMetrics(self.registry)
        self.outgoing: asyncio.Queue[events.Event] = asyncio.Queue()
        proc = settings.proc_root
        self.resolver = Resolver(build_sources(settings) if sources is None else sources,
                                 lambda pid: pidns_of(pid, proc), host_pidns(proc),
                                 cgroup_of=lambda pid: cgroup_of(pid, proc))
        self.bridge = Bridge(self.node, self.bus.subjects.event(self.node, "ownerback"),
                             self._enqueue, WatchSet(), self.resolver, self.metrics,
                             filter_config(settings))
        self.resolver.on_refresh.append(self.bridge.prune)
        self.metrics.follow_gpu_calls(self.bridge.gpu_calls)
        link_settings = LinkSettings(settings.reply_timeout_s, settings.heartbeat_s,
                                     settings.backoff_min_s, settings.backoff_max_s)
        self.link = KernelLink(transport or build_transport(settings), link_settings, self.metrics,
                               self.bridge.on_notice, self.bridge.on_registered, self._kernel_state)
        self.bridge.attach(self.link)
        self.skeleton.on_exit(self.bridge.close)
        self.skeleton.on_exit(self.link.transport.close)  # before NATS is drained
        for source in self.resolver.sources:
            if isinstance(source, ContainerdSource):
                self.skeleton.on_exit(source.close)

    def _kernel_state(self, registered: bool, reason: str) -> None:
        """Ready once registered and the watch set was sent (it waits to be read from NATS)."""
        if registered and not self.bridge.loaded:
            self.health.set("kernel", False, "registered; the watch set is not read back yet (NATS)")
            return
        self.health.set("kernel", registered, reason)

    async def _enqueue(self, subject: str, event: events.Event) -> None:
        self.outgoing.put_nowait(event)

    async def _publish_owner_backs(self) -> None:
        """Owner-backs reach the stream in the order the kernel saw them, each retried until the
        stream acknowledged it (a NATS restart delays them; nothing drops them)."""
        subject = self.bus.subjects.event(self.node, "ownerback")
        while True:
            event = await self.outgoing.get()
            try:
                await self.bus.publish_reliably(subject, event, self.stopping)
            except BusError as err:
                log.error("owner-back not published", node=self.node, id=event.id, error=str(err))

    async def start(self) -> None:
        """The kernel link first: holding a returning owner needs neither NATS nor the watch set,
        so a bridge that starts while NATS is away still registers, receives the notices the
        kernel sends again, and holds those owners until the solver can answer. The watch set is
        re-sent to the kernel once it is read back from its bucket."""
        self.skeleton.spawn("kernel link", self.link.run(self.stopping))
        self.skeleton.spawn("resolver", self.resolver.run(self.stopping, self.settings.refresh_s))
        await self.bus.connect(self.stopping)
        self.skeleton.spawn("owner-backs", self._publish_owner_backs())  # queued in kernel order meanwhile
        if self.settings.persist:
            await self.bus.wait_for_stream(self.stopping)
            store = await retry(lambda: self.bus.store("kmod", self.bus.layout.scope(self.node, "watch")),
                                (Transient,), "open the watch-set bucket", self.stopping, node=self.node)
            loaded = await retry(lambda: self.bridge.watchset.load(store), (Transient,), "read the watch set",
                                 self.stopping, node=self.node)
            log.info("watch set restored", node=self.node, bucket=store.bucket, namespaces=loaded)
            self.skeleton.spawn("watch-set saver", self._save_watch_set())
        await self.bridge.watch_set_loaded()
        self._kernel_state(self.link.registered.is_set(), self.link.last_error or "not registered")
        for role in KMOD_OPS:  # each role's requests on its own subject, checked against its ops
            await self.bus.serve(self.bus.subjects.kmod_requests(self.node, role), self.bridge.responder(role),
                                 invalid=self.bridge.undecodable)

    async def _save_watch_set(self, every_s: float = 1.0) -> None:
        """Write again what the bucket refused (the set in memory never waits for it)."""
        while True:
            await asyncio.sleep(every_s)
            if self.bridge.watchset.unsaved and not await self.bridge.watchset.flush():
                log.info("watch set saved again", node=self.node)

    def status(self) -> dict[str, Any]:
        return {"nats": self.bus.is_connected, **self.bridge.status()}
