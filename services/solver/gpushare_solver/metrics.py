"""The solver's Prometheus metrics, on its own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_MS_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class SolverMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.evictions = Counter("gpushare_solver_evictions", "Pods evicted, by reason and outcome",
                                 ["reason", "outcome"], registry=registry)
        self.refused = Counter("gpushare_solver_evictions_refused",
                               "Pods a plan named that failed verification (never killed nor deleted), by why",
                               ["why"], registry=registry)
        self.events = Counter("gpushare_solver_events", "Events handled, by type and result",
                              ["event", "result"], registry=registry)
        self.kill_seconds = Histogram("gpushare_solver_kill_seconds",
                                      "From the kill request to every task exited", ["reason"],
                                      buckets=_MS_BUCKETS, registry=registry)
        self.release_seconds = Histogram("gpushare_solver_release_seconds",
                                         "From the trigger event to the owner's release sent",
                                         buckets=_MS_BUCKETS, registry=registry)
        self.in_flight = Gauge("gpushare_solver_plans_in_flight", "Plans persisted and not finished",
                               registry=registry)
        self.borrowers = Gauge("gpushare_solver_borrowers", "Spot devices lent and in use",
                               registry=registry)
