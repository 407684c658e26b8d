"""The detector's Prometheus metrics, on its own registry."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from .scraper import ScrapeResult

FAST_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class DetectorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.published = Counter("gpushare_detector_events_published", "Events published by kind",
                                 ["kind"], registry=registry)
        self.publish_failures = Counter("gpushare_detector_publish_failures",
                                        "Events that could not be published (retried at the next resync)",
                                        registry=registry)
        self.pods = Gauge("gpushare_detector_pods", "Pods on this node by class", ["cls"], registry=registry)
        self.errors = Counter("gpushare_detector_errors", "Inputs ignored, by source and reason",
                              ["source", "reason"], registry=registry)
        self.scrapes = Counter("gpushare_detector_scrapes", "Exporter scrapes by outcome", ["outcome"],
                               registry=registry)
        self.owners = Gauge("gpushare_detector_owners", "Lendable owners by state", ["state"],
                            registry=registry)
        self.kmod = Counter("gpushare_detector_kmod_requests", "kmod-bridge requests by op and outcome",
                            ["op", "outcome"], registry=registry)
        self.resync = Histogram("gpushare_detector_resync_seconds", "Duration of a full resync",
                                buckets=FAST_BUCKETS, registry=registry)
        self.change_latency = Histogram("gpushare_detector_change_seconds",
                                        "Pod change received -> its events published",
                                        buckets=FAST_BUCKETS, registry=registry)
        self.spare = Gauge("gpushare_detector_spare_devices", "Spare capacity advertised, in devices",
                           ["resource"], registry=registry)

    def follow_gpus(self, last: Callable[[], ScrapeResult | None]) -> None:
        """Export the exporter's per-card and per-pod numbers; ``last`` gives the fresh scrape."""
        self.registry.register(GpuMetrics(last))


# (metric, help, the DeviceMetrics field)
_CARD = (("gpushare_gpu_utilisation_percent", "Card utilisation, from the vendor exporter", "utilisation"),
         ("gpushare_gpu_memory_used_bytes", "Card memory used, from the vendor exporter", "memory_used"))
_POD = (("gpushare_pod_gpu_utilisation_percent", "Utilisation the vendor exporter gives a pod's container "
         "on a card (time-sliced exporters repeat the card's)", "utilisation"),
        ("gpushare_pod_gpu_memory_used_bytes", "Card memory the vendor exporter gives a pod's container",
         "memory_used"))


class GpuMetrics:
    """The vendor exporter's numbers through the vendor mapping, from the last fresh scrape:
    per card (``card``), and per pod where the exporter labels its samples by pod
    (``card``, ``pod`` = namespace/name, ``container``). Nothing when the scrape failed or is old:
    unknown is never exported as 0."""

    def __init__(self, last: Callable[[], ScrapeResult | None]) -> None:
        self.last = last

    def collect(self) -> Iterator[Metric]:
        result = self.last()
        for name, text, field in _CARD:
            family = GaugeMetricFamily(name, text, labels=["card"])
            for card, found in sorted(result.devices.items()) if result else ():
                if getattr(found, field) is not None:
                    family.add_metric([card], getattr(found, field))
            yield family
        for name, text, field in _POD:
            family = GaugeMetricFamily(name, text, labels=["card", "pod", "container"])
            for (card, namespace, pod, container), found in sorted(result.pods.items()) if result else ():
                if getattr(found, field) is not None:
                    family.add_metric([card, f"{namespace}/{pod}" if namespace else pod, container],
                                      getattr(found, field))
            yield family
