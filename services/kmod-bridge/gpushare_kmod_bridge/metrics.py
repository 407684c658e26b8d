"""The bridge's Prometheus metrics, in the service's own registry."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

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

    def follow_gpu_calls(self, source: Callable[[], Iterable[CallCount]]) -> None:
        """Export the GPU calls the kernel module counted: ``source`` gives one count per namespace."""
        self.registry.register(GpuCalls(source))


class CallCount(NamedTuple):
    """The GPU calls counted in one pid namespace, and where its container sits."""

    pod: str
    container: str
    calls: int
    role: str = ""  # owner, sharer, borrower ("": not placed by the detector)
    card: str = ""  # the real cards, comma-separated
    shadow: str = ""  # a sharer's ShadowPod


class GpuCalls:
    """``gpushare_kmod_gpu_calls_total{pod,container,role,card,shadow}``: the GPU ioctls the
    kernel module counted for each container it watches — every container gpushare placed on a
    card: owners, SharePods, borrowers — per pid namespace, summed per container, from the
    module's last STATS reply (the heartbeat reads it every few seconds). Prometheus computes the
    rate; a container that starts again (a new pid namespace) restarts its count, which ``rate``
    takes as a counter reset. Namespaces not resolved to a pod are left out."""

    LABELS = ("pod", "container", "role", "card", "shadow")

    def __init__(self, source: Callable[[], Iterable[CallCount]]) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        totals: dict[tuple[str, ...], int] = {}
        for count in self.source():
            if count.pod:
                key = (count.pod, count.container, count.role, count.card, count.shadow)
                totals[key] = totals.get(key, 0) + count.calls
        family = CounterMetricFamily("gpushare_kmod_gpu_calls", "GPU calls the kernel module counted, per container "
                                     "gpushare placed on a card", labels=list(self.LABELS))  # fmt: skip
        for labels, calls in sorted(totals.items()):
            family.add_metric(list(labels), calls)
        yield family
