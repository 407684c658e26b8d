"""The detector wired together: pod changes and resyncs -> events; owners -> away/back.

Everything here takes its collaborators as arguments (bus, pod-resources,
scraper, clock), so the whole service runs in memory in tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

import msgspec
from gpushare_common import events as ev
from gpushare_common.adapters.kube import PodChange
from gpushare_common.adapters.podresources import PodNotFound, PodResourcesError
from gpushare_common.bus import BusError
from gpushare_common.logging import get_logger
from gpushare_common.retry import wait_any, wait_for_stop
from gpushare_common.subjects import Subjects

from .activity import ActivityMeter, card_figures
from .away import AwayMachine, Sample, State
from .handlers import kind_of
from .inventory import Inventory
from .kmod import KmodSync
from .metrics import DetectorMetrics
from .model import ContainerDevices, NodeDevices
from .pods import Owner, PodTracker
from .scraper import Scraper

log = get_logger("detector")


class Publisher(Protocol):
    subjects: Subjects

    async def publish(self, subject: str, event: ev.Event) -> None: ...

    async def publish_reliably(self, subject: str, event: ev.Event, stop: asyncio.Event | None = None,
                               deadline_s: float | None = None) -> int: ...


class FactStore(Protocol):
    """Where the published facts survive a restart (a JetStream key-value bucket)."""

    async def put(self, key: str, value: Any) -> int: ...

    async def delete(self, key: str) -> None: ...


class DeviceSource(Protocol):
    async def list(self) -> NodeDevices: ...

    async def get(self, namespace: str, name: str) -> dict[str, ContainerDevices]: ...

    async def allocatable(self) -> dict[str, tuple[str, ...]]: ...


class Detector:
    def __init__(self, node: str, tracker: PodTracker, bus: Publisher, devices: DeviceSource,
                 kmod: KmodSync, away: AwayMachine, scraper: Scraper | None, metrics: DetectorMetrics,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self.tracker = tracker
        self.bus = bus
        self.devices = devices
        self.kmod = kmod
        self.away = away
        self.scraper = scraper
        self.metrics = metrics
        self.clock = clock
        self.inventory = Inventory(node, tracker.rules.vendor_resources)
        self.holders_known = False  # the last full list of the pods' devices succeeded
        self.unpublished = 0  # events waiting for NATS to take them
        self.last_resync = 0.0
        self.synced = asyncio.Event()
        self.activity = ActivityMeter(node, clock)

    # --- publishing -------------------------------------------------------------

    async def publish(self, events: list[ev.Event]) -> None:
        """Publish until the stream has every event: while NATS is away this waits (and the pod
        changes queue up behind it) instead of dropping a fact until the next resync.

        Releases first: every ``cleared`` event is in the stream before any other of the list is
        sent. The events of one phase go out together, and a publish retried through a NATS
        failover lands after those that passed at once; a device handed from a pod that left to
        a new one (a re-list after a watch gap carries both) must never reach the solver as the
        new pod's use before the old pod's release."""
        releases = [e for e in events if getattr(e, "state", "") == "cleared"]
        others = [e for e in events if getattr(e, "state", "") != "cleared"]
        for phase in (releases, others):
            await asyncio.gather(*(self._publish_one(e) for e in phase))

    async def _publish_one(self, event: ev.Event) -> None:
        kind = kind_of(event)
        self.unpublished += 1
        try:
            await self.bus.publish_reliably(self.bus.subjects.event(self.node, kind), event)
        except BusError as err:  # refused for good (permission, size): it would never pass
            self.metrics.publish_failures.inc()
            log.error("event refused by NATS", node=self.node, event=kind, id=event.id, error=str(err))
            return
        finally:
            self.unpublished -= 1
        self.metrics.published.labels(kind).inc()

    # --- pods -------------------------------------------------------------------

    async def _devices_of(self, key: str) -> dict[str, ContainerDevices] | None:
        namespace, _, name = key.partition("/")
        try:
            return await self.devices.get(namespace, name)
        except PodNotFound:
            return {}
        except PodResourcesError as err:
            self.metrics.errors.labels("pod-resources", "unavailable").inc()
            log.warning("pod-resources unavailable", node=self.node, pod=key, error=str(err))
            return None

    async def _node_devices(self) -> NodeDevices:
        try:
            devices = await self.devices.list()
        except PodResourcesError as err:
            self.holders_known = False
            self.metrics.errors.labels("pod-resources", "unavailable").inc()
            log.warning("pod-resources unavailable, keeping the last devices", node=self.node, error=str(err))
            return dict(self.tracker.devices)
        self.holders_known = True
        return devices

    async def on_change(self, change: PodChange) -> None:
        started = time.perf_counter()
        if change.kind == "SYNC":
            events = self.tracker.replace_all(change.pods, await self._node_devices())
            self.synced.set()
        elif change.pod is not None:
            events = await self._on_pod(change.kind, change.pod)
        else:
            return
        await self.publish(events)
        if change.kind == "SYNC":
            await self.publish_inventory(resend=True)
        self._after_pods_changed()
        if events:
            self.metrics.change_latency.observe(time.perf_counter() - started)

    async def _on_pod(self, kind: str, pod: dict[str, Any]) -> list[ev.Event]:
        view = self.tracker.read(pod)
        if view is None:
            return []
        if kind == "DELETED":
            return self.tracker.remove(view.key)
        devices = await self._devices_of(view.key) if self.tracker.needs_devices(view) else {}
        return self.tracker.upsert(view, devices)

    def _after_pods_changed(self) -> None:
        self.kmod.want(self.tracker.placements())
        owners = self.tracker.owners()
        for owner in owners.values():
            self.away.track(owner.key, owner.devices, owner.containers)
        self.away.forget_except(owners)
        for cls, count in self.tracker.by_class().items():
            self.metrics.pods.labels(cls).set(count)

    async def watch(self, changes: AsyncIterator[PodChange]) -> None:
        async for change in changes:
            await self.on_change(change)

    # --- resync -----------------------------------------------------------------

    async def resync(self) -> int:
        """Republish the whole current state (idempotent ids), clearing what vanished."""
        with self.metrics.resync.time():
            changes = self.tracker.refresh_all(await self._node_devices())
            self._after_pods_changed()
            seen = {e.id for e in changes}
            current = [e for e in self.tracker.current() if e.id not in seen]
            events = [*changes, *current, *self.away.events()]
            await self.publish(events)
            await self.publish_inventory(resend=True)
            self.kmod.resend()
        self.last_resync = self.clock()
        return len(events)

    async def resync_loop(self, stop: asyncio.Event, every_s: float) -> None:
        await wait_any(self.synced, stop)
        while not stop.is_set():
            await wait_for_stop(stop, every_s)
            if not stop.is_set():
                await self.resync()

    # --- card inventory ---------------------------------------------------------

    async def publish_inventory(self, resend: bool = False) -> None:
        """Publish the card inventories that changed (every one with ``resend``): after the pods'
        events, so the solver knows who holds a card before it sees the card as allocatable; never
        while the pods' devices are unknown (the last full list failed), or held cards would be lent."""
        if not self.holders_known:
            return
        changed = await self.inventory.refresh(self.devices, self.metrics)
        await self.publish(list(self.inventory.current()) if resend else list(changed))

    async def inventory_loop(self, stop: asyncio.Event, every_s: float) -> None:
        await wait_any(self.synced, stop)
        while not stop.is_set():
            await wait_for_stop(stop, every_s)
            if not stop.is_set():
                await self.publish_inventory()

    # --- persistence ------------------------------------------------------------

    async def save_facts(self, store: FactStore) -> int:
        """Write the facts of the pods that changed; a failure keeps them for the next try."""
        await self.inventory.save(store, self.metrics)
        dirty, self.tracker.dirty = self.tracker.dirty, set()
        for key in sorted(dirty):
            facts = self.tracker.published.get(key)
            try:
                await (store.put(key, list(facts.values())) if facts else store.delete(key))
            except BusError as err:  # keep it dirty: the next save tries again
                self.tracker.dirty.add(key)
                self.metrics.errors.labels("kv", "unwritable").inc()
                log.warning("published facts not saved", node=self.node, pod=key, error=repr(err))
        return len(dirty)

    async def save_loop(self, store: FactStore, stop: asyncio.Event, every_s: float = 0.5) -> None:
        while not stop.is_set():
            await wait_for_stop(stop, every_s)
            await self.save_facts(store)

    # --- owners: away/back ------------------------------------------------------

    async def observe_owners(self) -> None:
        """One sample: the GPU calls of every container placed on a card (the node's activity)
        and, of every lendable owner, its own calls and utilisation; publishes transitions.
        Only an owner's own namespaces (role ``owner``) are its activity: a busy sharer or
        borrower never brings it back."""
        if self.scraper is not None:
            await self.scraper.scrape()
        placed = dict(self.kmod.wanted)
        fresh = self.scraper.fresh() if self.scraper is not None else None
        pids = tuple(sorted({pid for _, pid in fresh.processes})) if fresh is not None else ()
        answer = await self.kmod.stats(tuple(sorted(placed)), pids)
        stats = answer[0] if answer is not None else None
        if fresh is not None and answer is not None:
            fresh.attribute(answer[1])  # the exporter's per-process figures, now the pods'
        await self._publish_activity(placed, stats)
        for owner in self.tracker.owners().values():
            hits = _hits_of(owner, stats)
            sample = Sample(self._utilisation(owner, placed, hits), hits)
            if (moved := self.away.observe(owner.key, sample)) is not None:
                log.info("owner state changed", node=self.node, pod=owner.key, state=str(moved.state),
                         reason=moved.reason)
                await self._publish_owner(owner.key)
        self._count_owners()

    def _utilisation(self, owner: Owner, placed: Mapping[str, ev.Placement], hits: int | None) -> float | None:
        """Its cards' utilisation; unknown while another container gpushare placed (a borrower)
        is on one of them and the kernel counts the owner's own calls: the card's figure is then
        not the owner's, and the kernel's counts and notice decide."""
        if self.scraper is None or (hits is not None and _others_on(owner, placed)):
            return None
        return self.scraper.utilisation(owner.devices)

    async def _publish_activity(self, placed: Mapping[str, ev.Placement],
                                stats: Sequence[ev.NamespaceStats] | None) -> None:
        fresh = self.scraper.fresh() if self.scraper is not None else None
        event = self.activity.sample(placed, stats, fresh.pods if fresh is not None else {})
        if fresh is not None:
            event = msgspec.structs.replace(event, cards=card_figures(fresh.devices))
        try:
            await self.bus.publish(self.bus.subjects.activity(self.node), event)
        except BusError as err:  # the next sample says it again
            self.metrics.errors.labels("activity", "unpublished").inc()
            log.debug("activity not published", node=self.node, error=str(err))

    async def _publish_owner(self, owner: str) -> None:
        event = self.away.event(owner)
        if event is not None:
            await self.publish([event])

    def _count_owners(self) -> None:
        states = [s.state for s in self.away.owners.values()]
        for state in State:
            self.metrics.owners.labels(str(state)).set(states.count(state))

    async def on_owner_back(self, event: ev.AnyEvent) -> None:
        if not isinstance(event, ev.OwnerBackEvent):
            return
        owner = "/".join(event.pod.split("/")[:2]) if event.pod else ""
        if not owner:
            self.metrics.errors.labels("ownerback", "unresolved").inc()
            return
        if self.away.owner_back(owner) is not None:
            log.info("owner back", node=self.node, pod=owner, pidns=event.pidns)
            await self._publish_owner(owner)
            self._count_owners()

    async def owners_loop(self, stop: asyncio.Event, every_s: float) -> None:
        while not stop.is_set():
            await self.observe_owners()
            await wait_for_stop(stop, every_s)

    # --- status -----------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "pods": self.tracker.by_class(),
            "facts": len(self.tracker.current()),
            "unpublished": self.unpublished,
            "card_inventory": {e.vendor_resource: list(e.devices) for e in self.inventory.current()},
            "owners": self.away.status(),
            "scrape": self.scraper.status() if self.scraper is not None else None,
            "kmod": self.kmod.status(),
            "last_resync_age_s": round(self.clock() - self.last_resync, 1) if self.last_resync else None,
            "errors": dict(self.tracker.errors),
        }


def _hits_of(owner: Owner, stats: Sequence[ev.NamespaceStats] | None) -> int | None:
    """The owner's own ioctl hits: its containers' namespaces, never a counted-only one (a
    sharer's, a borrower's); a bridge that names no container names the pod."""
    if stats is None:
        return None
    found = [s.hits for s in stats if not ev.counted_only(s.role)
             and (f"{s.pod}/{s.container}" in owner.containers if s.container else s.pod == owner.key)]  # fmt: skip
    return sum(found) if found else None


def _others_on(owner: Owner, placed: Mapping[str, ev.Placement]) -> bool:
    """Whether a container other than the owner's is placed on one of its cards."""
    cards = set(owner.devices)
    return any(key not in owner.containers and cards & set(where.cards) for key, where in placed.items())

