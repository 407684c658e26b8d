"""What the solver persists beside the MappingCache: seen event ids, ShadowPods being deleted,
the card inventory and the real cards of each ShadowPod."""

from __future__ import annotations

from collections import OrderedDict

import msgspec

from .state import Victim


class JournalDoc(msgspec.Struct, kw_only=True):
    seen: list[str] = []
    terminating: list[str] = []
    inventory: dict[str, list[str]] = {}  # vendor resource -> cards the kubelet can allocate
    shadow_cards: dict[str, list[str]] = {}  # ShadowPod -> the real cards it holds
    dra_shared: dict[str, list[str]] = {}  # inventory -> the cards DRA share claims use
    lend_after: float = 0.0  # the inventory lends nothing before (wall clock), after a rebuild
    evicting: dict[str, Victim] = {}  # pods taken out of the cache to be evicted


class Seen:
    """The ids of the last ``capacity`` events applied (idempotency across redeliveries)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._ids

    def add(self, event_id: str) -> None:
        self._ids[event_id] = None
        self._ids.move_to_end(event_id)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def discard(self, event_id: str) -> None:
        self._ids.pop(event_id, None)

    def recent(self, count: int) -> list[str]:
        return list(self._ids)[-count:]

    def load(self, ids: list[str]) -> None:
        for event_id in ids:
            self.add(event_id)
