"""The solver's Prometheus metrics, on its own registry."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from gpushare_common.cardmap import CardUse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

_MS_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class SolverMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.evictions = Counter("gpushare_solver_evictions", "Pods evicted, by reason and outcome",
                                 ["reason", "outcome"], registry=registry)
        self.discovered = Counter("gpushare_solver_borrowers_discovered",
                                  "Borrowers of a card taken back that the kubelet named before their SpotEvent "
                                  "came (found)",
                                  ["outcome"], registry=registry)
        self.fences = Counter("gpushare_solver_fences",
                              "Fences before a reclaim's pod-resources lookup: confirmed (the device plugin refuses "
                              "Allocate of the devices taken back), open (it still serves one Healthy) or "
                              "unconfirmed (no device plugin answered)", ["outcome"], registry=registry)
        self.refused = Counter("gpushare_solver_evictions_refused",
                               "Pods a plan named that failed verification (never killed nor deleted), by why; "
                               "why=kubelet-unreadable counts reclaims put off because the kubelet could not "
                               "confirm them",
                               ["why"], registry=registry)
        self.lend_withheld = Counter("gpushare_solver_lend_withheld",
                                     "Cards not lent because the kubelet says a container the solver does not "
                                     "know holds them (held), or could not say (kubelet-unreadable)",
                                     ["why"], registry=registry)
        self.told = Counter("gpushare_solver_evictions_told",
                            "Evicted pods told why in Kubernetes' terms: their DisruptionTarget condition "
                            "(what=condition) and Events (what=event), written or failed",
                            ["what", "outcome"], registry=registry)
        self.events = Counter("gpushare_solver_events", "Events handled, by type and result",
                              ["event", "result"], registry=registry)
        self.kill_seconds = Histogram("gpushare_solver_kill_seconds",
                                      "From the kill request to every task exited; only kills that found a task",
                                      ["reason"],
                                      buckets=_MS_BUCKETS, registry=registry)
        self.release_seconds = Histogram("gpushare_solver_release_seconds",
                                         "From the trigger event to the owner's release sent",
                                         buckets=_MS_BUCKETS, registry=registry)
        self.in_flight = Gauge("gpushare_solver_plans_in_flight", "Plans persisted and not finished",
                               registry=registry)
        self.borrowers = Gauge("gpushare_solver_borrowers", "Spot devices lent and in use",
                               registry=registry)
        self.owner_back = Histogram("gpushare_solver_owner_back_seconds",
                                    "An owner-back's hops, from the solver taking it: the borrowers' tasks dead, "
                                    "the owner released, the last borrower evicted", ["hop"],
                                    buckets=_MS_BUCKETS, registry=registry)
        self.cards = CardLedger()
        registry.register(self.cards)

    def owner_back_done(self, handled: float, dead_at: float, released_at: float, evicted_at: float) -> None:
        """One owner-back's reclaim finished (wall clock times; 0: that hop did not happen)."""
        for hop, at in (("tasks_dead", dead_at), ("released", released_at), ("evicted", evicted_at)):
            if at:
                self.owner_back.labels(hop).observe(max(0.0, at - handled))


class CardLedger:
    """The sharing and lending map as metrics, a Prometheus collector.

    ``gpushare_card_state{card,state}`` is 1 for each card's state (:mod:`gpushare_common.cardmap`);
    ``gpushare_card_users{card,pod,kind}`` is 1 for each pod using a card (kind ``owner``: the
    pod holding it, a ShadowPod included; ``sharer``: a SharePod on the ShadowPod's devices;
    ``borrower``: a spot pod); ``gpushare_card_lent_seconds_total{card}`` and
    ``gpushare_card_idle_seconds_total{card}`` add up the time each card was lent, or lendable
    and not borrowed. :meth:`update` (in the solver's loop, after each change) replaces one
    immutable snapshot; :meth:`collect` (in the HTTP thread) only reads it.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._snapshot: tuple[tuple[CardUse, ...], dict[str, float], dict[str, float], float] = \
            ((), {}, {}, clock())

    def update(self, cards: Iterable[CardUse]) -> None:
        now = self.clock()
        old, lent, idle, since = self._snapshot
        lent, idle = dict(lent), dict(idle)
        for card in old:
            book = lent if card.state == "lent" else idle if card.state == "idle" else None
            if book is not None:
                book[card.card] = book.get(card.card, 0.0) + (now - since)
        self._snapshot = (tuple(cards), lent, idle, now)

    def collect(self) -> Iterator[Metric]:
        cards, lent, idle, since = self._snapshot
        extra = self.clock() - since
        users = GaugeMetricFamily("gpushare_card_users", "Pods using each card, by how (owner, sharer, borrower)",
                                  labels=["card", "pod", "kind"])
        for card in cards:
            for pod, kind in card.users():
                users.add_metric([card.card, pod, kind], 1)
        yield users
        states = GaugeMetricFamily("gpushare_card_state", "1 for each card's state (held, shared, lent, idle, "
                                   "unhealthy)", labels=["card", "state"])
        for card in cards:
            states.add_metric([card.card, card.state], 1)
        yield states
        for state, book in (("lent", lent), ("idle", idle)):
            total = dict(book)
            for card in cards:
                if card.state == state:
                    total[card.card] = total.get(card.card, 0.0) + extra
            family = CounterMetricFamily(f"gpushare_card_{state}_seconds", _TIME_HELP[state], labels=["card"])
            for card_id, seconds in sorted(total.items()):
                family.add_metric([card_id], seconds)
            yield family


_TIME_HELP = {"lent": "Seconds each card was lent to a borrower",
              "idle": "Seconds each card was lendable (nobody holding it, or its owner away) and not borrowed"}
