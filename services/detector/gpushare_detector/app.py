"""The detector's lifecycle: connect, serve HTTP, run the named tasks, drain."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from gpushare_common.adapters.kube import Kube
from gpushare_common.bus import Bus
from gpushare_common.events import AnyEvent
from gpushare_common.http import Health, build_app, serve
from gpushare_common.logging import get_logger
from gpushare_common.pods import SYSTEM_NAMESPACE, PodRules
from gpushare_common.tasks import Tasks, wait_first
from prometheus_client import CollectorRegistry

from .adapters.exporter import fetch_text
from .adapters.podresources import PodResources
from .away import AwayMachine
from .capacity_service import CapacityService
from .detector import Detector
from .kmod import KmodSync
from .metrics import DetectorMetrics
from .pods import PodTracker
from .scraper import Scraper
from .settings import DetectorSettings, Settings
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


async def run(settings: Settings, stop: asyncio.Event) -> int:
    node = settings.common.node.require()
    config = settings.detector
    registry = CollectorRegistry()
    metrics = DetectorMetrics(registry)
    health = Health("nats", "pods")
    tasks = Tasks(SERVICE)
    async with contextlib.AsyncExitStack() as stack:
        bus = Bus(settings.common.nats, SERVICE, registry, node)
        bus.on_state.append(lambda up: health.set("nats", up, "" if up else "disconnected"))
        await bus.connect(stop)
        stack.push_async_callback(bus.drain)
        await bus.wait_for_stream(stop)
        devices = PodResources(config.pod_resources_socket, config.pod_resources_timeout_s)
        stack.push_async_callback(devices.close)
        detector = build_detector(node, config, bus, devices, metrics, settings.common.kube.system_namespace)
        facts = await bus.store("detector", bus.layout.scope(node, "fact"))
        saved = await facts.items(list[AnyEvent])
        restored = detector.tracker.restore(saved)
        log.info("restored published facts", node=node, pods=restored,
                 inventories=detector.inventory.restore(saved))
        capacity = CapacityService.build(node, config, bus, detector.tracker, metrics)
        kube = Kube(settings.common.kube)

        def status() -> dict[str, Any]:
            return {**detector.status(), "capacity": capacity.status()}

        await stack.enter_async_context(serve(build_app(SERVICE, health, registry, status),
                                              settings.common.http))
        await bus.subscribe(bus.subjects.event(node, "ownerback"), detector.on_owner_back)
        until_cancelled = asyncio.Event()  # the loops end only when cancel_all() cancels them
        changes = kube.watch_pods(until_cancelled, field_selector=f"spec.nodeName={node}")
        tasks.spawn("watch", detector.watch(changes))
        tasks.spawn("resync", detector.resync_loop(until_cancelled, config.resync_s))
        tasks.spawn("inventory", detector.inventory_loop(until_cancelled, config.inventory_s))
        tasks.spawn("kmod", detector.kmod.run(until_cancelled))
        tasks.spawn("save", detector.save_loop(facts, until_cancelled))
        tasks.spawn("owners", detector.owners_loop(until_cancelled, config.scrape_s))
        tasks.spawn("capacity", capacity.loop(until_cancelled))
        tasks.spawn("ready", _ready_when_synced(detector, health), critical=False)
        await wait_first(stop, tasks)
        await tasks.cancel_all()
        await detector.save_facts(facts)
        stack.callback(kube.api.close)
    return 1 if tasks.failure is not None else 0


async def _ready_when_synced(detector: Detector, health: Health) -> None:
    await detector.synced.wait()
    health.set("pods", True)
