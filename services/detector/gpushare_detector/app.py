"""The detector's lifecycle: serve HTTP, connect, restore the published facts, run the loops, drain.

- Consumes: the node's pods (API server watch), their cards (kubelet
  pod-resources), the GPU exporter's metrics, owner-backs (core subject).
- Publishes: pod events, card inventories, away/back, spare capacity (stream);
  per-pod GPU activity (core, every scrape); kmod-bridge requests (the placed containers);
  its published facts (``detector`` bucket, saved on exit).
- Runs: watch, resync, inventory, kmod, save, owners, capacity; HTTP.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpushare_common.adapters.kube import Kube
from gpushare_common.adapters.podresources import PodResources
from gpushare_common.events import AnyEvent
from gpushare_common.http import Health
from gpushare_common.logging import get_logger
from gpushare_common.pods import SYSTEM_NAMESPACE, PodRules
from gpushare_common.service import ServiceBase

from .adapters.exporter import fetch_text
from .away import AwayMachine
from .capacity_service import CapacityService
from .detector import Detector
from .kmod import KmodSync
from .metrics import DetectorMetrics
from .pods import PodTracker
from .scraper import Scraper
from .settings import DetectorSettings, Settings
from .status import DetectorStatus
from .vendors import BUILTIN_DIR, MappingError, load_mappings

SERVICE = "detector"
log = get_logger(SERVICE)


def rules_of(settings: DetectorSettings, system_namespace: str = SYSTEM_NAMESPACE) -> PodRules:
    return PodRules(domain=settings.domain, vendor_resources=settings.vendor_resources,
                    system_namespace=system_namespace,
                 lendable_key=settings.lendable_key, lendable_value=settings.lendable_value)


def build_scraper(settings: DetectorSettings, metrics: DetectorMetrics) -> Scraper | None:
    if not settings.exporter_url:
        return None
    directories = [BUILTIN_DIR] + ([Path(settings.mapping_dir)] if settings.mapping_dir else [])
    mappings = load_mappings(*directories)
    if settings.vendor not in mappings:
        raise MappingError(settings.vendor, f"no mapping for vendor (known: {', '.join(sorted(mappings))})")
    return Scraper(settings.exporter_url, mappings[settings.vendor], fetch_text, settings.scrape_timeout_s,
                   max_age_s=3 * settings.scrape_s, clock=time.monotonic, metrics=metrics)


def build_detector(node: str, settings: DetectorSettings, bus: Any, devices: Any,
                   metrics: DetectorMetrics, system_namespace: str = SYSTEM_NAMESPACE) -> Detector:
    return Detector(
        node=node, tracker=PodTracker(rules_of(settings, system_namespace), node), bus=bus,
        devices=devices,
        kmod=KmodSync(bus, node, settings.kmod_timeout_s, metrics),
        away=AwayMachine(node, settings.away_window_s, time.monotonic),
        scraper=build_scraper(settings, metrics), metrics=metrics,
    )


class Service(ServiceBase):
    """One node's detector."""

    status_model = DetectorStatus

    def __init__(self, settings: Settings, stop: asyncio.Event | None = None) -> None:
        common, config = settings.common, settings.detector
        super().__init__(SERVICE, common.http, "nats", "pods", stop=stop)
        self.node = node = common.node.require()
        self.config = config
        self.metrics = DetectorMetrics(self.registry)
        self.bus = self.skeleton.bus(common.nats, node)
        devices = PodResources(config.pod_resources_socket, config.pod_resources_timeout_s)
        self.skeleton.on_exit(devices.close)
        self.detector = build_detector(node, config, self.bus, devices, self.metrics, common.kube.system_namespace)
        self.capacity = CapacityService.build(node, config, self.bus, self.detector.tracker, self.metrics)
        self.kube = Kube(common.kube)
        self.skeleton.on_exit(self.kube.close)

    async def start(self) -> None:
        svc, bus, node, detector, config = self.skeleton, self.bus, self.node, self.detector, self.config
        await bus.connect(svc.stop)
        await bus.wait_for_stream(svc.stop)
        facts = await bus.store("detector", bus.layout.scope(node, "fact"))
        saved = await facts.items(list[AnyEvent])
        restored = detector.tracker.restore(saved)
        log.info("restored published facts", node=node, pods=restored,
                 inventories=detector.inventory.restore(saved))
        await bus.subscribe(bus.subjects.event(node, "ownerback"), detector.on_owner_back)
        until_cancelled = svc.stopping  # set only once the loops are cancelled: they end only then
        changes = self.kube.watch_pods(until_cancelled, field_selector=f"spec.nodeName={node}")
        svc.spawn("watch", detector.watch(changes))
        svc.spawn("resync", detector.resync_loop(until_cancelled, config.resync_s))
        svc.spawn("inventory", detector.inventory_loop(until_cancelled, config.inventory_s))
        svc.spawn("kmod", detector.kmod.run(until_cancelled))
        svc.spawn("save", detector.save_loop(facts, until_cancelled))
        svc.spawn("owners", detector.owners_loop(until_cancelled, config.scrape_s))
        svc.spawn("capacity", self.capacity.loop(until_cancelled))
        svc.spawn("ready", _ready_when_synced(detector, self.health), critical=False)
        svc.on_exit(detector.save_facts, facts)  # once the loops are cancelled

    def status(self) -> Mapping[str, Any]:
        return {**self.detector.status(), "capacity": self.capacity.status()}


async def _ready_when_synced(detector: Detector, health: Health) -> None:
    await detector.synced.wait()
    health.set("pods", True)
