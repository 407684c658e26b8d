"""The driver's Prometheus metrics."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram

BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class DriverMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter("gpushare_dra_claims_total", "Claims prepared or unprepared, by outcome",
                             ["call", "outcome"], registry=registry)
        self.seconds = Histogram("gpushare_dra_call_seconds", "NodePrepareResources / NodeUnprepareResources",
                                 ["call"], buckets=BUCKETS, registry=registry)
        self.slices = Counter("gpushare_dra_slice_publishes_total", "ResourceSlice writes", registry=registry)
        self.publish_seconds = Histogram("gpushare_dra_slice_publish_seconds", "One ResourceSlice write",
                                         buckets=BUCKETS, registry=registry)

    def observe(self, call: str, results: Iterable[object], seconds: float) -> None:
        self.seconds.labels(call).observe(seconds)
        for result in results:
            failed = isinstance(result, str) and bool(result)
            self.calls.labels(call, "failed" if failed else "ok").inc()
