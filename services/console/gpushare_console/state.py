"""What the console knows, kept current by its watchers; every change bumps :attr:`Changes.version`.

- nodes and pods: the Kubernetes API (list + watch), each pod read once by
  :func:`gpushare_common.pods.read_pod`;
- per node, the solver's state: its MappingCache (``<node>.mapping.<owner>`` in the solver's
  bucket), its journal's card facts (``<node>.journal.state``) and the desired health of the
  spot devices (``<node>.health.<spot resource>`` in the health bucket), followed by watches;
- per node, the size of one ``vcpu``/``vmem`` device (the last SpareCapacity seen);
- per node, the GPU activity of every container gpushare placed on a card and each card's
  figures (the detector's last GpuActivity);
- ResourceClaims and gpushare's ResourceSlices (the API, list + watch; :mod:`.dra`): a DRA
  card's claims, its shares and its spot mirror;
- which pods are gpushare's own services (labels ``app.kubernetes.io/part-of: gpushare`` and
  ``app.kubernetes.io/name``, in the system namespace): their Ready condition is the kubelet's
  probe of each one's ``/readyz``;
- the eviction timeline (:mod:`.timeline`).

A value that does not decode is skipped, logged and counted by source, never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from gpushare_common.bus import escape_key, unescape_key
from gpushare_common.bus.watch import KeyChange, KeyChanges
from gpushare_common.cardmap import CardFacts, CardUse, card_map
from gpushare_common.events import CardFigures, ContainerActivity, DeviceHealth, GpuActivity, SpareCapacity
from gpushare_common.logging import get_logger
from gpushare_common.mapping import MappingCache, OwnerEntry
from gpushare_common.pods import Pod, PodError, PodKind, PodRules, pod_key, read_pod
from gpushare_common.subjects import node_from_token

from .dra import Claim, NodeSlice, object_key, read_claim, read_slice
from .timeline import Timeline

log = get_logger("console.state")
Obj = dict[str, Any]
SERVICE_LABEL, PART_OF_LABEL, PART_OF = "app.kubernetes.io/name", "app.kubernetes.io/part-of", "gpushare"


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    ready: bool = False
    unschedulable: bool = False
    capacity: dict[str, str] = {}
    allocatable: dict[str, str] = {}


def node_name(doc: Mapping[str, Any]) -> str:
    """A Node object's name; ValueError without one."""
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ValueError("node without metadata.name")
    return name


def read_node(doc: Mapping[str, Any]) -> NodeInfo:
    """A Node object's name, readiness and resources; ValueError naming what is malformed."""
    name, spec, status = node_name(doc), doc.get("spec") or {}, doc.get("status") or {}
    if not isinstance(spec, Mapping) or not isinstance(status, Mapping):
        raise ValueError(f"node {name}: spec and status must be objects")
    listed = status.get("conditions")
    conditions: list[Any] = listed if isinstance(listed, list) else []
    ready = any(isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
                for c in conditions)  # fmt: skip
    return NodeInfo(name=name, ready=ready, unschedulable=bool(spec.get("unschedulable")),
                    capacity=_quantities(name, status.get("capacity")),
                    allocatable=_quantities(name, status.get("allocatable")))  # fmt: skip


def service_of(doc: Mapping[str, Any], system_namespace: str) -> str:
    """The gpushare service a pod runs (its ``app.kubernetes.io/name``: gpushare's own pods in the
    system namespace), "" for any other pod."""
    meta = doc.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(meta, Mapping) or not isinstance(labels, Mapping) or \
            meta.get("namespace") != system_namespace or labels.get(PART_OF_LABEL) != PART_OF:
        return ""
    name = labels.get(SERVICE_LABEL)
    return name if isinstance(name, str) else ""


def _quantities(node: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"node {node}: status resources must be an object")
    return {str(k): str(v) for k, v in value.items()}


@dataclass
class SolverView:
    """One node's part of the solver's state, as its buckets hold it."""

    owners: dict[str, OwnerEntry] = field(default_factory=dict)
    facts: CardFacts = field(default_factory=CardFacts)
    spot_health: dict[str, str] = field(default_factory=dict)

    def cards(self) -> list[CardUse]:
        cache = MappingCache()
        cache.load(self.owners.values())
        return card_map(cache, self.facts.inventory, self.facts.shadow_cards, self.spot_health, self.facts.dra_shared)


class Changes:
    """A version number and a wake-up for whoever waits for the next one."""

    def __init__(self) -> None:
        self.version = 0
        self._event = asyncio.Event()

    def bump(self) -> None:
        self.version += 1
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, seen: int, timeout: float) -> int:
        """The version once it differs from ``seen`` (or after ``timeout``)."""
        if self.version == seen:
            event = self._event
            try:
                await asyncio.wait_for(event.wait(), timeout)
            except TimeoutError:
                pass
        return self.version


class ClusterState:
    def __init__(self, rules: PodRules, keep: int, spot_resource: str = "spot-gpu",
                 on_problem: Callable[[str], object] = lambda source: None) -> None:  # fmt: skip
        self.rules = rules
        self.on_problem = on_problem
        self.spot_resource = spot_resource
        self.nodes: dict[str, NodeInfo] = {}
        self.pods: dict[str, Pod] = {}
        self.solver: dict[str, SolverView] = {}
        self.units: dict[tuple[str, str], int] = {}  # (node, vcpu|vmem) -> size of one device
        self.activity: dict[str, tuple[ContainerActivity, ...]] = {}  # node -> its placed containers
        self.card_figures: dict[str, tuple[float, dict[str, CardFigures]]] = {}  # node -> (when, card -> figures)
        self.services: dict[str, str] = {}  # pod key -> the gpushare service it runs
        self.claims: dict[str, Claim] = {}  # namespace/name -> ResourceClaim
        self.slices: dict[str, NodeSlice] = {}  # name -> ResourceSlice
        self.timeline = Timeline(keep)
        self.changes = Changes()
        self.problems: Counter[str] = Counter()  # inputs skipped, by source
        self.synced: set[str] = set()  # sources that delivered their first full state

    def _problem(self, source: str, what: str, reason: str) -> None:
        self.problems[source] += 1
        self.on_problem(source)
        log.warning("input skipped", source=source, what=what, reason=reason)

    # --- Kubernetes -------------------------------------------------------------

    def nodes_changed(self, kind: str, obj: Obj | None, items: list[Obj]) -> None:
        self._changed("nodes", self.nodes, self._put_node, node_name, kind, obj, items)

    def _put_node(self, doc: Obj) -> None:
        try:
            node = read_node(doc)
        except ValueError as err:
            self._problem("nodes", str((doc.get("metadata") or {}).get("name", "?")), str(err))
            return
        self.nodes[node.name] = node

    def pods_changed(self, kind: str, obj: Obj | None, items: list[Obj]) -> None:
        if kind == "SYNC":
            self.services.clear()
        elif obj is not None and kind == "DELETED":
            with contextlib.suppress(PodError):
                self.services.pop(pod_key(obj), None)
        self._changed("pods", self.pods, self._put_pod, pod_key, kind, obj, items)

    def claims_changed(self, kind: str, obj: Obj | None, items: list[Obj]) -> None:
        self._changed("claims", self.claims, self._put_claim, object_key, kind, obj, items)

    def slices_changed(self, kind: str, obj: Obj | None, items: list[Obj]) -> None:
        self._changed("slices", self.slices, self._put_slice, object_key, kind, obj, items)

    def _changed(self, source: str, book: dict[str, Any], put: Callable[[Obj], None],
                 key_of: Callable[[Obj], str], kind: str, obj: Obj | None, items: list[Obj]) -> None:  # fmt: skip
        """A list (``SYNC``: the whole set) or one watch event of nodes or pods; a deleted object
        is known by its key alone (``key_of``: ValueError when it has none)."""
        if kind == "SYNC":
            book.clear()
            for doc in items:
                put(doc)
            self.synced.add(source)
        elif obj is not None and kind == "DELETED":
            try:
                book.pop(key_of(obj), None)
            except ValueError as err:
                self._problem(source, "?", str(err))
        elif obj is not None:
            put(obj)
        self.changes.bump()

    def _put_pod(self, doc: Obj) -> None:
        try:
            pod = read_pod(doc, self.rules)
        except PodError as err:
            self._problem("pods", err.pod, err.reason)
            return
        self.pods[pod.key] = pod
        service = service_of(doc, self.rules.system_namespace) if pod.kind != PodKind.SHADOW else ""
        if service:
            self.services[pod.key] = service

    def _put_claim(self, doc: Obj) -> None:
        try:
            claim = read_claim(doc)
        except ValueError as err:
            self._problem("claims", _name(doc), str(err))
            return
        self.claims[claim.key] = claim

    def _put_slice(self, doc: Obj) -> None:
        try:
            found = read_slice(doc)
        except ValueError as err:
            self._problem("slices", _name(doc), str(err))
            return
        self.slices[found.name] = found

    # --- the solver's buckets ---------------------------------------------------

    def _views(self, node: str) -> list[SolverView]:
        """What a reset replaces: one node's view (its own leaf's watch), or every node's."""
        return [self.solver.setdefault(node, SolverView())] if node else list(self.solver.values())

    def solver_changed(self, batch: KeyChanges, node: str = "") -> None:
        """Changes of the solver's bucket (``*.mapping.>`` and ``*.journal.>``), of one node or all."""
        if batch.reset:
            for view in self._views(node):
                view.owners, view.facts = {}, CardFacts()
            self.synced.add("solver")
        for change in batch.changes:
            try:
                self._solver_key(change)
            except ValueError as err:  # a key whose escapes do not decode
                self._problem("solver", change.key, str(err))
        self.changes.bump()

    def _solver_key(self, change: KeyChange) -> None:
        parts = change.key.split(".", 2)
        if len(parts) != 3:
            self._problem("solver", change.key, "not <node>.<kind>.<key>")
            return
        view = self.solver.setdefault(node_from_token(parts[0]), SolverView())
        owner = unescape_key(parts[2])
        if parts[1] == "mapping" and change.value is None:
            view.owners.pop(owner, None)
        elif parts[1] == "mapping":
            entry = self._decode("solver", change, OwnerEntry)
            if entry is not None:
                view.owners[owner] = entry
        elif parts[1] == "journal":
            facts = self._decode("solver", change, CardFacts) if change.value is not None else CardFacts()
            view.facts = facts or view.facts

    def health_changed(self, batch: KeyChanges, node: str = "") -> None:
        """Changes of the health bucket (``*.health.<spot resource>``), of one node or all."""
        if batch.reset:
            for view in self._views(node):
                view.spot_health = {}
            self.synced.add("health")
        for change in batch.changes:
            parts = change.key.split(".", 2)
            if len(parts) != 3 or parts[2] != escape_key(self.spot_resource):
                continue
            view = self.solver.setdefault(node_from_token(parts[0]), SolverView())
            health = self._decode("health", change, DeviceHealth) if change.value is not None else None
            view.spot_health = {d: str(h) for d, h in health.devices.items()} if health is not None else {}
        self.changes.bump()

    def _decode(self, source: str, change: KeyChange, kind: type[Any]) -> Any:
        try:
            return msgspec.json.decode(change.value or b"", type=kind)
        except msgspec.DecodeError as err:
            self._problem(source, change.key, f"does not decode: {err}")
            return None

    # --- events ---------------------------------------------------------------------

    def activity_seen(self, event: GpuActivity) -> None:
        """A node's activity; the page is told when a container's changed or a card's rounded
        utilisation did."""
        before = self.card_figures.get(event.node, (0.0, {}))[1]
        self.card_figures[event.node] = (event.ts, dict(event.cards))
        if self.activity.get(event.node) != event.containers or _percents(before) != _percents(event.cards):
            self.activity[event.node] = event.containers
            self.changes.bump()

    def capacity_seen(self, event: SpareCapacity) -> None:
        if event.unit > 0 and self.units.get((event.node, event.resource)) != event.unit:
            self.units[(event.node, event.resource)] = event.unit
            self.changes.bump()


def _percents(cards: dict[str, CardFigures]) -> dict[str, int | None]:
    return {card: None if f.utilisation is None else round(f.utilisation) for card, f in cards.items()}


def _name(doc: Obj) -> str:
    try:
        return object_key(doc)
    except ValueError:
        return "?"
