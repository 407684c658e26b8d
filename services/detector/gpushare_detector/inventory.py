"""The node's card inventory: every card of each vendor resource the kubelet can allocate.

:meth:`Inventory.update` (pure) takes the kubelet's allocatable devices
(pod-resources ``GetAllocatableResources``) and returns one
:class:`CardInventory` per vendor resource whose cards changed;
:meth:`Inventory.refresh` reads them first, :meth:`Inventory.save` keeps the
last inventories in the detector's facts bucket. An event's id
is a hash of its content salted with the id of the inventory it replaces: a
republication of the same inventory (a resync, a restarted detector that
restored its last events) keeps its id, while coming back to an earlier
inventory (a card gone, then back) gets a new one, which JetStream's
de-duplication and the solver's idempotency must not drop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import msgspec
from gpushare_common import events as ev
from gpushare_common.adapters.podresources import PodResourcesError
from gpushare_common.bus import BusError
from gpushare_common.logging import get_logger

from .handlers import stable_id
from .metrics import DetectorMetrics

log = get_logger("detector.inventory")

# Key of the last inventories in the detector's facts bucket (pod keys always contain a "/").
INVENTORY_KEY = "inventory"


class Allocatable(Protocol):
    async def allocatable(self) -> dict[str, tuple[str, ...]]: ...


class Store(Protocol):
    async def put(self, key: str, value: Any) -> int: ...


class Inventory:
    def __init__(self, node: str, vendor_resources: Iterable[str]) -> None:
        self.node = node
        self.vendor_resources = tuple(vendor_resources)
        self.published: dict[str, ev.CardInventory] = {}
        self.dirty = False  # changed since last saved
        self.error = ""  # the last failure to read the allocatable devices

    def restore(self, saved: Mapping[str, list[ev.AnyEvent]]) -> int:
        """The inventories published before a restart (from the facts bucket)."""
        for event in saved.get(INVENTORY_KEY, []):
            if isinstance(event, ev.CardInventory) and event.vendor_resource in self.vendor_resources:
                self.published[event.vendor_resource] = event
        return len(self.published)

    def update(self, allocatable: Mapping[str, Iterable[str]]) -> list[ev.CardInventory]:
        """The inventories that changed; a vendor resource the kubelet does not list has no cards."""
        changed = []
        for resource in self.vendor_resources:
            cards = tuple(sorted(set(allocatable.get(resource, ()))))
            old = self.published.get(resource)
            if old is not None and old.devices == cards:
                continue
            event = ev.CardInventory(node=self.node, vendor_resource=resource, devices=cards)
            event = msgspec.structs.replace(event, id=stable_id(event, old.id if old else ""))
            self.published[resource] = event
            changed.append(event)
        self.dirty = self.dirty or bool(changed)
        return changed

    def current(self) -> list[ev.CardInventory]:
        return [self.published[r] for r in self.vendor_resources if r in self.published]

    async def refresh(self, devices: Allocatable, metrics: DetectorMetrics) -> list[ev.CardInventory]:
        """Read the allocatable devices; the inventories that changed (none when unreadable)."""
        try:
            changed = self.update(await devices.allocatable())
        except PodResourcesError as err:
            metrics.errors.labels("pod-resources", "allocatable").inc()
            if str(err) != self.error:  # one line per new failure, not one per poll
                log.warning("allocatable devices unavailable, card inventory kept", node=self.node,
                            error=str(err))
            self.error = str(err)
            return []
        self.error = ""
        for event in changed:
            log.info("card inventory changed", node=self.node, resource=event.vendor_resource,
                     cards=",".join(event.devices))
        return changed

    async def save(self, store: Store, metrics: DetectorMetrics) -> None:
        if not self.dirty:
            return
        self.dirty = False
        try:
            await store.put(INVENTORY_KEY, self.current())
        except BusError as err:  # save it next time
            self.dirty = True
            metrics.errors.labels("kv", "unwritable").inc()
            log.warning("card inventory not saved", node=self.node, error=repr(err))
