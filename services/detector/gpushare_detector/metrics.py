"""The detector's Prometheus metrics, on its own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

FAST_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class DetectorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
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
