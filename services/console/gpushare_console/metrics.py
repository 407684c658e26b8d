"""The console's Prometheus metrics, on its own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ConsoleMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.updates = Counter("gpushare_console_updates", "Changes taken in, by source", ["source"],
                               registry=registry)
        self.skipped = Counter("gpushare_console_inputs_skipped", "Inputs that did not decode, by source",
                               ["source"], registry=registry)
        self.clients = Gauge("gpushare_console_live_clients", "Browsers following the live updates",
                             registry=registry)
        self.stream_errors = Counter("gpushare_console_stream_errors", "Reads of the event stream that failed",
                                     registry=registry)
