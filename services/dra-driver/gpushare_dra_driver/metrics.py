"""The driver's Prometheus metrics."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram

BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
# a prepare's parts, finely (a regression shows where it is): 0.1 ms steps to 2 ms, then coarser
PART_BUCKETS = (*(i / 10_000 for i in range(1, 21)), 0.0025, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.025, 0.1, 1.0)
PART_READ = "claim_read"  # reading the claims from the API
PART_DRIVER = "driver"  # everything else: the driver's own time


class DriverMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter("gpushare_dra_claims_total", "Claims prepared or unprepared, by outcome",
                             ["call", "outcome"], registry=registry)
        self.seconds = Histogram("gpushare_dra_call_seconds", "NodePrepareResources / NodeUnprepareResources",
                                 ["call"], buckets=BUCKETS, registry=registry)
        self.prepare_parts = Histogram("gpushare_dra_prepare_part_seconds",
                                       "NodePrepareResources split: the claims' read from the API "
                                       f"({PART_READ}) and the driver's own time ({PART_DRIVER})",
                                       ["part"], buckets=PART_BUCKETS, registry=registry)
        self.slices = Counter("gpushare_dra_slice_publishes_total", "ResourceSlice writes", registry=registry)
        self.publish_seconds = Histogram("gpushare_dra_slice_publish_seconds", "One ResourceSlice write",
                                         buckets=BUCKETS, registry=registry)

    def observe_prepare(self, read_s: float, total_s: float) -> None:
        self.prepare_parts.labels(PART_READ).observe(read_s)
        self.prepare_parts.labels(PART_DRIVER).observe(max(total_s - read_s, 0.0))

    def observe(self, call: str, results: Iterable[object], seconds: float) -> None:
        self.seconds.labels(call).observe(seconds)
        for result in results:
            failed = isinstance(result, str) and bool(result)
            self.calls.labels(call, "failed" if failed else "ok").inc()
