"""The JSON behind each page, built from :class:`~.state.ClusterState` (pure functions).

- fleet: every node with its cards (held / shared by N / lent / idle / unhealthy) at a glance
  and each one's utilisation (the detector's scrape of the vendor exporter), gpushare's pods on
  it with their readiness;
- node: each card with its holder, ShadowPod and SharePods, borrower, and each of these pods'
  GPU activity on the card (``activity``: the kernel module's calls and their rate, the
  exporter's utilisation where it names the pod); on a DRA node its ResourceClaims with their
  shares and its spot mirror (:mod:`.dra`); the node's pods; the spare CPU and memory sold
  again (``gpushare/vcpu``, ``gpushare/vmem``);
- evictions: the timeline (:mod:`.timeline`).

A card the node reports as not allocatable (vendor capacity above allocatable) that no state
names is shown as an unnamed unhealthy card.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import msgspec
from gpushare_common.cardmap import CARD_STATES, DRA_SHARES, CardUse
from gpushare_common.events import CardFigures, ContainerActivity
from gpushare_common.pods import Pod
from gpushare_common.quantity import QuantityError, parse_count

from . import dra
from .dra import DraCard
from .settings import ConsoleSettings
from .state import ClusterState, NodeInfo, SolverView

Obj = dict[str, Any]
Cards = list[tuple[CardUse, DraCard | None]]
FIGURES_MAX_AGE_S = 60.0  # a node's card figures older than this (its detector silent) are not shown


def _count(value: str) -> int:
    """Devices of a node's capacity or allocatable (the API server checked them: a value that is
    no whole number shows as none)."""
    try:
        return parse_count(value, "node resource")
    except QuantityError:
        return 0


def _dra_cards(state: ClusterState, name: str) -> dict[str, DraCard]:
    return dra.node_cards(name, state.slices.values(), state.claims.values())


def _cards(state: ClusterState, settings: ConsoleSettings, name: str, found: dict[str, DraCard]) -> Cards:
    """The node's cards: the solver's, as a DRA node's claims make them (``found``), and one
    unnamed unhealthy card for each the Node reports as not allocatable that no state names."""
    cards = dra.with_claims(state.solver.get(name, SolverView()).cards(), found)
    info = state.nodes.get(name)
    if info is None:
        return cards
    missing = sum(_count(info.capacity.get(r, "0")) - _count(info.allocatable.get(r, "0"))
                  for r in settings.vendor_resources)  # fmt: skip
    missing -= sum(1 for c, _ in cards if c.state == "unhealthy")
    return cards + [(CardUse(card="", state="unhealthy"), None) for _ in range(max(0, missing))]


def figures(state: ClusterState, name: str) -> dict[str, CardFigures]:
    """The node's cards' vendor figures, when its detector sent them lately."""
    when, cards = state.card_figures.get(name, (0.0, {}))
    return cards if time.time() - when <= FIGURES_MAX_AGE_S else {}


def card_cell(card: CardUse, found: DraCard | None = None, usage: CardFigures | None = None) -> Obj:
    """A card's state and users, its vendor figures (``usage``: utilisation in percent, memory in
    bytes; None: unknown); on a DRA node (``found``) its claims too."""
    shared = f"shared by {len(card.sharers)}" if card.sharers or card.holder_kind != DRA_SHARES else "shared (DRA)"
    label = {"shared": shared, "lent": "lent"}.get(card.state, card.state)
    claims = [{**msgspec.structs.asdict(c), "pods": list(c.pods)} for c in (found.claims if found else ())]
    return {"card": card.card, "state": card.state, "label": label, "holder": card.holder,
            "holder_kind": card.holder_kind, "sharers": list(card.sharers), "share_devices": card.share_devices,
            "borrower": card.borrower, "spot_health": card.spot_health, "dra": found is not None,
            "claims": claims, "usage": msgspec.structs.asdict(usage) if usage is not None else None}  # fmt: skip


def spare(state: ClusterState, settings: ConsoleSettings, info: NodeInfo | None, name: str) -> Obj:
    """Spare CPU (millicores) and memory (bytes) the node sells again, from its allocatable devices."""
    domain = settings.domain
    vcpu = _count(info.allocatable.get(f"{domain}/vcpu", "0")) if info else 0
    vmem = _count(info.allocatable.get(f"{domain}/vmem", "0")) if info else 0
    cpu_unit = state.units.get((name, "vcpu"), settings.vcpu_millicores)
    mem_unit = state.units.get((name, "vmem"), settings.vmem_bytes)
    return {"vcpu_devices": vcpu, "vcpu_millicores": vcpu * cpu_unit,
            "vmem_devices": vmem, "vmem_bytes": vmem * mem_unit}  # fmt: skip


def node_names(state: ClusterState) -> list[str]:
    return sorted(set(state.nodes) | {n for n, v in state.solver.items() if v.owners or v.facts.inventory})


def services(state: ClusterState, name: str) -> list[Obj]:
    """gpushare's pods on the node, each with its readiness (the kubelet's probe of its ``/readyz``)."""
    found = sorted((service, pod) for key, service in state.services.items()
                   if (pod := state.pods.get(key)) is not None and pod.node == name)  # fmt: skip
    return [{"name": service.removeprefix("gpushare-"), "pod": pod.key, "ready": pod.ready, "phase": pod.phase}
            for service, pod in found]  # fmt: skip


def fleet(state: ClusterState, settings: ConsoleSettings) -> Obj:
    nodes, totals = [], Counter[str]()
    for name in node_names(state):
        info = state.nodes.get(name)
        cards, usage = _cards(state, settings, name, _dra_cards(state, name)), figures(state, name)
        counts = Counter(c.state for c, _ in cards)
        totals.update(counts)
        nodes.append({"name": name, "ready": bool(info and info.ready), "known": info is not None,
                      "cards": [card_cell(c, f, usage.get(c.card)) for c, f in cards],
                      "counts": {s: counts[s] for s in CARD_STATES},
                      "spare": spare(state, settings, info, name), "services": services(state, name)})  # fmt: skip
    return {"version": state.changes.version, "nodes": nodes, "totals": {s: totals[s] for s in CARD_STATES},
            "pods": len(state.pods), "synced": sorted(state.synced)}  # fmt: skip


def pod_row(pod: Pod | None, key: str = "", claims: list[str] | None = None) -> Obj:
    """A pod; ``claims``: what its DRA claims on the node's cards are for (share, exclusive, spot)."""
    if pod is None:
        return {"key": key, "known": False}
    return {"key": pod.key, "known": True, "kind": str(pod.kind), "phase": pod.phase,
            "terminating": pod.terminating, "lendable": pod.lendable,
            "share": pod.share.resource if pod.share else "", "device_owner": pod.device_owner,
            "containers": sorted(pod.containers), "created": pod.created, "claims": claims or []}  # fmt: skip


def _plus(total: float | None, value: float | None) -> float | None:
    return total if value is None else (total or 0) + value


def pod_activity(rows: Iterable[ContainerActivity], card: str) -> dict[str, Obj]:
    """Per pod on ``card``: its role, GPU calls and calls per second summed over its containers
    (None: not counted yet), the exporter's highest utilisation for it (None: none)."""
    found: dict[str, Obj] = {}
    for row in rows:
        if card not in row.cards:
            continue
        seen = found.setdefault(row.pod, {"role": row.role, "calls": None, "calls_per_s": None, "utilisation": None})
        seen["calls"] = _plus(seen["calls"], row.calls)
        seen["calls_per_s"] = _plus(seen["calls_per_s"], row.calls_per_s)
        if row.utilisation is not None:
            seen["utilisation"] = max(seen["utilisation"] or 0.0, row.utilisation)
    return found


def card_detail(card: CardUse, pods: dict[str, Pod], found: DraCard | None = None,
                activity: Iterable[ContainerActivity] = (), usage: CardFigures | None = None) -> Obj:
    return {**card_cell(card, found, usage), "activity": pod_activity(activity, card.card),
            "holder_pod": pod_row(pods.get(card.holder), card.holder) if card.holder else None,
            "sharer_pods": [pod_row(pods.get(p), p) for p in card.sharers],
            "borrower_pod": pod_row(pods.get(card.borrower), card.borrower) if card.borrower else None}  # fmt: skip


def node(state: ClusterState, settings: ConsoleSettings, name: str) -> Obj | None:
    info = state.nodes.get(name)
    if info is None and name not in state.solver:
        return None
    pods = sorted((p for p in state.pods.values() if p.node == name), key=lambda p: (str(p.kind), p.key))
    found, usage = _dra_cards(state, name), figures(state, name)
    roles = dra.pod_roles(found)
    return {
        "version": state.changes.version, "name": name, "ready": bool(info and info.ready),
        "unschedulable": bool(info and info.unschedulable),
        "capacity": info.capacity if info else {}, "allocatable": info.allocatable if info else {},
        "cards": [card_detail(c, state.pods, f, state.activity.get(name, ()), usage.get(c.card))
                  for c, f in _cards(state, settings, name, found)],
        "pods": [pod_row(p, claims=roles.get(p.key)) for p in pods], "spare": spare(state, settings, info, name),
    }  # fmt: skip


def evictions(state: ClusterState) -> Obj:
    return {"version": state.changes.version, "entries": state.timeline.entries()}
