"""The bridge's Prometheus metrics, in the service's own registry."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class BridgeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = self.registry = registry or CollectorRegistry()
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
        self.holds = Counter("gpushare_kmod_bridge_holds",
                             "HOLDs the bridge sent for an owner-back the solver had not answered yet",
                             registry=reg)
        self.unanswered = Counter("gpushare_kmod_bridge_holds_exhausted",
                                  "Owner-backs the solver had not answered within the kernel's max_hold_ms "
                                  "(the owner continued at its deadline)", registry=reg)
        self.watched = Gauge("gpushare_kmod_watched_namespaces",
                             "Pid namespaces in the watch set by mode", ["mode"], registry=reg)

    def follow_gpu_calls(self, source: Callable[[], Iterable[tuple[str, str, int]]]) -> None:
        """Export the GPU calls the kernel module counted: ``source`` gives (pod, container, calls)."""
        self.registry.register(GpuCalls(source))


class GpuCalls:
    """``gpushare_kmod_gpu_calls_total{pod,container}``: the GPU ioctls the kernel module counted
    for each container it watches (per pid namespace, summed per container), from the module's
    last STATS reply (the heartbeat reads it every few seconds). Prometheus computes the rate; a
    container that starts again (a new pid namespace) restarts its count, which ``rate`` takes
    as a counter reset. Namespaces not resolved to a pod are left out."""

    def __init__(self, source: Callable[[], Iterable[tuple[str, str, int]]]) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        totals: dict[tuple[str, str], int] = {}
        for pod, container, calls in self.source():
            if pod:
                totals[(pod, container)] = totals.get((pod, container), 0) + calls
        family = CounterMetricFamily("gpushare_kmod_gpu_calls", "GPU calls the kernel module counted, per container",
                                     labels=["pod", "container"])
        for (pod, container), calls in sorted(totals.items()):
            family.add_metric([pod, container], calls)
        yield family
