"""Lifecycle of the device-plugin service: serve every plugin, feed it, serve HTTP, drain.

Plugins start serving and registering first, with every spot device
Unhealthy (safe: nothing is lent before the solver says so); then NATS
connects, the desired health is read back from the key-value bucket and the
live subjects take over.

- Consumes: desired device health, spare capacity and spot use (core subjects;
  the ``health`` bucket after every reconnect), the vendor plugins' device
  lists, ShadowPods (API server watch).
- Answers: fences (``fence.<resource>``: a desired health applied at once, so
  the solver looks up a reclaim's borrowers only once no Allocate can add one).
- Publishes: nothing else on NATS; the devices, to the kubelet (device-plugin API).
- Runs: supervisor, vendor feeds, ShadowPod feed, NATS connect, health resync; HTTP.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gpushare_common import events
from gpushare_common.adapters.vendorplugin import VendorCard, watch_vendor
from gpushare_common.bus import BusError, Permanent
from gpushare_common.logging import get_logger
from gpushare_common.pods import PodRules
from gpushare_common.service import ServiceBase
from gpushare_common.settings import CommonSettings
from gpushare_common.topology import CardTopology, card_topology
from gpushare_common.vendors import VendorResource
from prometheus_client import CollectorRegistry

from .adapters import kube as kube_adapter
from .devices import HEALTHY, UNHEALTHY
from .handlers.base import Signer
from .handlers.share import shadow_view
from .plugins.manager import PluginSet
from .plugins.metrics import PluginMetrics
from .plugins.supervisor import Supervisor
from .settings import DevicePluginSettings
from .status import DevicePluginStatus

SERVICE = "deviceplugin"
log = get_logger(SERVICE)


class Service(ServiceBase):
    """All plugins of one node, wired to NATS, the vendor plugins and the API server."""

    status_model = DevicePluginStatus
    freeze_after_start = True  # the kubelet's Allocate and ListAndWatch calls must not wait on a collection

    def __init__(self, common: CommonSettings, settings: DevicePluginSettings, key: bytes,
                 registry: CollectorRegistry | None = None, vendors: dict[str, VendorResource] | None = None,
                 stop: asyncio.Event | None = None) -> None:
        super().__init__(SERVICE, common.http, "nats", "kubelet", stop=stop, registry=registry)
        self.common = common
        self.vendors = vendors or {}
        self.settings = settings
        self.node = common.node.require()
        self.bus = self.skeleton.bus(common.nats, self.node)
        self.plugins = PluginSet(settings, Signer(key, self.node), PluginMetrics(self.registry))
        self.supervisor = Supervisor(self.plugins.plugins, settings.kubelet_path, settings.poll_s,
                                     settings.backoff_min_s, settings.backoff_max_s,
                                     on_tick=self._readiness)
        self.rules = PodRules(domain=settings.domain, system_namespace=common.kube.system_namespace)

    # --- startup ----------------------------------------------------------------

    async def start(self) -> None:
        """The plugins serve and register at once (every spot device Unhealthy until the solver
        says otherwise); NATS connects in the background."""
        self.start_plugins()
        self.skeleton.spawn("nats connect", self.connect(), critical=False)

    def start_plugins(self) -> None:
        self.skeleton.spawn("supervisor", self.supervisor.run(self.stopping))
        if self.plugins.spot is not None:
            for vendor, socket in self.settings.vendor_sockets.items():
                self.skeleton.spawn(f"vendor {vendor}", self._feed_vendor(vendor, socket))
        if self.settings.watch_shadow_pods and self.plugins.share():
            self.skeleton.spawn("shadow pods", self._feed_shadows())

    async def connect(self) -> None:
        await self.bus.connect(self.stopping)
        await self.bus.wait_for_stream(self.stopping)
        subjects = self.bus.subjects
        for subject in (subjects.node_health(self.node), subjects.node_capacity(self.node),
                        subjects.event(self.node, "spot")):
            await self.bus.subscribe(subject, self._on_event)
        await self.bus.serve(subjects.node_fences(self.node), self._on_fence)
        await self.load_desired_health()
        self.skeleton.spawn("health resync", self._resync_health())

    async def load_desired_health(self) -> int:
        """Apply every newer desired health kept in the bucket; returns how many applied."""
        store = await self.bus.store("health", self.bus.layout.scope(self.node, "health"))
        applied = 0
        for token in self.plugins.logics:
            try:
                saved = await store.get(token, events.DeviceHealth)
            except Permanent as err:
                log.warning("undecodable desired health skipped", node=self.node, resource=token,
                            bucket=store.bucket, reason=err.reason)
                continue
            if saved is not None and self.plugins.apply(saved):
                applied += 1
        return applied

    async def _resync_health(self) -> None:
        """Core subscriptions miss what is published while disconnected: re-read the bucket
        after every reconnect, and every ``resync_s`` as a safety net."""
        seen, last = self._reconnects(), time.monotonic()
        while True:
            await asyncio.sleep(0.2)
            reconnects = self._reconnects()
            due = time.monotonic() - last >= self.settings.resync_s
            if not self.bus.is_connected or (reconnects == seen and not due):
                continue
            try:
                applied = await self.load_desired_health()
            except BusError as err:  # retry next round
                log.warning("desired health resync failed", node=self.node, error=repr(err))
                continue
            if reconnects != seen:
                log.info("desired health re-read after reconnect", node=self.node,
                         applied=applied)
            seen, last = reconnects, time.monotonic()

    def _reconnects(self) -> int:
        return self.bus.reconnects

    # --- feeds ------------------------------------------------------------------

    async def _on_event(self, event: events.AnyEvent) -> None:
        if not self.plugins.apply(event):
            log.debug("event for no plugin", node=self.node, event=events.event_tag(event))

    async def _on_fence(self, request: events.AnyEvent) -> events.Event:
        """A fence: the solver takes devices back and asks, before it looks up who holds them,
        that no Allocate of them succeed any more. Their health is applied at once (Allocate runs
        on this same loop, so none can slip in after this answer) and the answer says what is
        served now. Anything but a desired health is answered with nothing applied."""
        if not isinstance(request, events.DeviceHealth):
            log.warning("fence request is not a desired health", node=self.node, got=events.event_tag(request))
            return events.HealthApplied(node=self.node, resource="", request_id=request.id)
        self.plugins.apply(request)
        served = self.plugins.served(request.resource, request.devices)
        log.info("fence applied", node=self.node, resource=request.resource, reason=request.reason or None,
                 devices=",".join(f"{d}={h}" for d, h in sorted(served.items())))
        return events.HealthApplied(node=self.node, resource=request.resource, devices=served, request_id=request.id)

    async def _feed_vendor(self, vendor: str, socket: str) -> None:
        spot = self.plugins.spot
        async for cards in watch_vendor(vendor, self.settings.path(socket), self.stopping,
                                        self.settings.backoff_min_s, self.settings.backoff_max_s):
            if spot is None:
                continue
            for card in (cards or {}).values():
                spot.set_topology(card.id, self._topology(vendor, card))
            spot.set_vendor_cards(vendor, None if cards is None else
                                  {i: HEALTHY if c.healthy else UNHEALTHY for i, c in cards.items()})

    def _topology(self, vendor: str, card: VendorCard) -> CardTopology:
        """Where a card sits: sysfs through the vendor table, else the vendor plugin's NUMA node."""
        entry = self.vendors.get(vendor)
        where = card_topology(entry, card.id, self.settings.host_root) if entry else CardTopology()
        if where.numa_node is None and card.numa_nodes:
            return CardTopology(where.pci_bus_id, card.numa_nodes[0], where.pcie_root)
        return where

    async def _feed_shadows(self) -> None:
        async for pods in kube_adapter.watch_shadow_pods(self.common.kube, self.node, self.stopping):
            self.plugins.replace_shadows(v for p in pods if (v := shadow_view(p, self.rules)) is not None)

    # --- views ------------------------------------------------------------------

    def _readiness(self) -> None:
        registered = all(p.state == "registered" for p in self.plugins.plugins)
        self.health.set("kubelet", registered, "" if registered else "not every plugin registered")

    def status(self) -> dict[str, Any]:  # on close, the supervisor stops every plugin as it ends
        return {
            "node": self.node,
            "kubelet_socket": self.settings.kubelet_path,
            "kubelet_generations": self.supervisor.kubelet_generations,
            "nats": self.bus.is_connected,
            **self.plugins.status(),
        }
