"""The bridge's Prometheus metrics, in the service's own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class BridgeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = registry or CollectorRegistry()
        self.notices = Counter("gpushare_kmod_notices", "Kernel notices received", registry=reg)
        self.published = Counter("gpushare_kmod_ownerback_published",
                                 "OwnerBackEvents published", ["resolved"], registry=reg)
        self.latency = Histogram("gpushare_kmod_notice_to_publish_seconds",
                                 "Kernel timestamp of the hit to the event's publish",
                                 buckets=LATENCY_BUCKETS_S, registry=reg)
        self.malformed = Counter("gpushare_kmod_malformed_messages",
                                 "Kernel messages that did not decode (skipped)", registry=reg)
        self.errors = Counter("gpushare_kmod_errors", "Link and command errors by kind",
                              ["kind"], registry=reg)
        self.registrations = Counter("gpushare_kmod_registrations",
                                     "Successful REGISTER exchanges", registry=reg)
        self.commands = Counter("gpushare_kmod_commands", "Commands served by op and outcome",
                                ["op", "outcome"], registry=reg)
        self.stale = Counter("gpushare_kmod_stale_entries",
                             "Watch-set entries dropped because their container was gone or replaced",
                             ["found_by"], registry=reg)
        self.watched = Gauge("gpushare_kmod_watched_namespaces",
                             "Pid namespaces in the watch set by mode", ["mode"], registry=reg)
