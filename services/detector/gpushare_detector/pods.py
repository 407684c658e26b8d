"""The node's pods as the detector last saw them, and the facts it has published about them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpushare_common import events as ev
from gpushare_common.logging import get_logger
from gpushare_common.pods import Pod as PodView
from gpushare_common.pods import PodError, PodKind, PodRules, read_pod

from .handlers import Facts, fact_key, plan, pod_facts
from .model import DevicesOf, NodeDevices, NodeDevicesIn
from .placements import placements

log = get_logger("detector.pods")
POD_FACTS = (ev.ShadowEvent, ev.ShareEvent, ev.SpotEvent, ev.ReservedEvent)
NEEDS_DEVICES = frozenset({PodKind.SHADOW, PodKind.SHARE, PodKind.SPOT, PodKind.RESERVED})


@dataclass(frozen=True, slots=True)
class Owner:
    """A lendable dev machine: its real cards and its containers (``ns/pod/container``)."""

    key: str
    devices: tuple[str, ...]
    containers: tuple[str, ...]


class PodTracker:
    """Pods by key, their devices, and per pod the facts already published."""

    def __init__(self, rules: PodRules, node: str) -> None:
        self.rules = rules
        self.node = node
        self.views: dict[str, PodView] = {}
        self.devices: NodeDevices = {}
        self.published: dict[str, Facts] = {}
        self.dirty: set[str] = set()  # pods whose published facts changed since the last save
        self.errors: Counter[str] = Counter()

    def read(self, pod: Mapping[str, Any]) -> PodView | None:
        try:
            view = read_pod(pod, self.rules)
        except PodError as err:
            self.errors["malformed-pod"] += 1
            log.warning("ignored malformed pod", node=self.node, pod=err.pod, reason=err.reason)
            return None
        if view.forged_shadow and view.key not in self.views:
            self.errors["forged-shadow-pod"] += 1
            log.warning("pod carries the ShadowPod label outside the system namespace; not a ShadowPod",
                        node=self.node, pod=view.key, system_namespace=self.rules.system_namespace)
        return view

    def _refresh(self, key: str) -> list[ev.Event]:
        view = self.views.get(key)
        desired = pod_facts(view, self.rules, self.node, self.devices.get(key, {})) if view else {}
        events = plan(self.published.get(key, {}), desired)
        if events:
            self.dirty.add(key)
        if desired:
            self.published[key] = desired
        else:
            self.published.pop(key, None)
        return events

    def upsert(self, view: PodView, devices: DevicesOf | None) -> list[ev.Event]:
        """A pod was added or changed; ``devices`` from pod-resources (None: keep what we had)."""
        self.views[view.key] = view
        if devices is not None:
            self.devices[view.key] = {c: dict(r) for c, r in devices.items()}
        return self._refresh(view.key)

    def remove(self, key: str) -> list[ev.Event]:
        """A pod was deleted: withdraw everything published about it."""
        self.views.pop(key, None)
        self.devices.pop(key, None)
        return self._refresh(key)

    def replace_all(self, pods: Iterable[Mapping[str, Any]], devices: NodeDevicesIn) -> list[ev.Event]:
        """A full list (after a (re)list or for a resync): changes only."""
        views = [v for p in pods if (v := self.read(p)) is not None]
        self.views = {v.key: v for v in views}
        return self.refresh_all(devices)

    def refresh_all(self, devices: NodeDevicesIn) -> list[ev.Event]:
        self.devices = {k: {c: dict(r) for c, r in v.items()} for k, v in devices.items() if k in self.views}
        events: list[ev.Event] = []
        for key in sorted(set(self.views) | set(self.published)):
            events.extend(self._refresh(key))
        return events

    def restore(self, saved: Mapping[str, list[ev.AnyEvent]]) -> int:
        """Facts published before a restart, so the first list clears pods deleted meanwhile."""
        for key, events in saved.items():
            facts: Facts = {fact_key(e): e for e in events if isinstance(e, POD_FACTS)}
            if facts:
                self.published[key] = facts
        return len(self.published)

    def current(self) -> list[ev.Event]:
        """Every fact published and still true (what a resync republishes)."""
        return [e for facts in self.published.values() for e in facts.values()]

    def needs_devices(self, view: PodView) -> bool:
        return (view.kind in NEEDS_DEVICES or bool(view.claims)) and not view.finished

    def placements(self) -> dict[str, ev.Placement]:
        """Every container gpushare placed on a card (owners, sharers, borrowers), by
        ``ns/pod/container``, from the facts and the kubelet's pod-resources."""
        running = {k: d for k, d in self.devices.items() if (v := self.views.get(k)) is not None and not v.finished}
        return placements(self.current(), running)

    def owners(self) -> dict[str, Owner]:
        """Lendable reserved pods holding cards, by pod key."""
        found: dict[str, tuple[set[str], set[str]]] = {}
        for event in self.current():
            if isinstance(event, ev.ReservedEvent) and event.lendable:
                devices, containers = found.setdefault(event.pod, (set(), set()))
                devices.update(event.devices)
                containers.add(f"{event.pod}/{event.container}")
        return {k: Owner(k, tuple(sorted(d)), tuple(sorted(c))) for k, (d, c) in found.items()}

    def by_class(self) -> dict[str, int]:
        return dict(Counter(str(v.kind) for v in self.views.values()))
