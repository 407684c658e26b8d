"""The solver's in-memory state: the MappingCache plus what it needs beside it.

Owner kinds in the cache: ``shadow`` (a ShadowPod: its virtual devices, users
are SharePods), ``reserved`` (an ordinary pod or an active dev machine holding
real cards), ``spot-owner`` (a dev machine whose owner is away: its real cards
are lent) and ``idle-space`` (the ``spot-<id>`` devices lent out; users are
borrowers).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec
from gpushare_common.events import Health
from gpushare_common.mapping import IDLE_SPACE, MappingCache
from gpushare_common.mapping import RESERVED as RESERVED  # the owner kinds, re-exported for the handlers
from gpushare_common.mapping import SHADOW as SHADOW
from gpushare_common.mapping import SPOT_OWNER as SPOT_OWNER


class Victim(msgspec.Struct, frozen=True, kw_only=True):
    """A pod a handler took out of the mapping cache to evict it: what the cache knew of it.
    The reclaimer kills and deletes only pods recorded here, on this node, with this uid."""

    uid: str = ""  # "" when the event that put it in the cache did not name one
    devices: tuple[str, ...] = ()  # the devices it used (of ``owner``)
    owner: str = ""
    since: float = 0.0
    cards: tuple[str, ...] = ()  # the real cards behind ``devices``, when they are not spot devices


class Evicted:
    """The pods this solver evicted lately (pod -> uid, when): a SpotEvent that arrives after its
    pod's eviction (a borrower found through the kubelet before the detector reported it) is
    news of a pod that is gone, not a new borrower. Bounded; not persisted (a restarted solver
    reads the node again)."""

    def __init__(self, keep: int = 1024, unnamed_s: float = 120.0, clock: Callable[[], float] = time.time) -> None:
        self.keep = keep
        self.unnamed_s = unnamed_s  # a pod evicted with no uid known is matched by name this long
        self.clock = clock
        self._pods: dict[str, tuple[str, float]] = {}

    def add(self, pod: str, uid: str) -> None:
        self._pods.pop(pod, None)
        self._pods[pod] = (uid, self.clock())
        while len(self._pods) > self.keep:
            del self._pods[next(iter(self._pods))]

    def has(self, pod: str, uid: str = "") -> bool:
        """Whether ``pod`` (with ``uid`` when known) is one this solver evicted."""
        seen = self._pods.get(pod)
        if seen is None:
            return False
        known, at = seen
        if known and uid:
            return known == uid
        return self.clock() - at <= self.unnamed_s


@dataclass(frozen=True)
class KubeletView:
    """What the kubelet's pod-resources said, just before an event that may lend a card was
    handled: the real cards some container holds (vendor IDs, DRA exclusive claims), and the
    ShadowPods some container holds a virtual device of. A card held this way by a holder the
    solver does not know is never lent; the default (nobody holds anything) is for pure tests."""

    cards: frozenset[str] = frozenset()
    shadows: frozenset[str] = frozenset()


class HandlerError(ValueError):
    """An event that contradicts the state (e.g. a device given to two pods): dropped and counted."""

    def __init__(self, event_id: str, reason: str) -> None:
        self.event_id = event_id
        self.reason = reason
        super().__init__(f"event {event_id}: {reason}")


DRA_SHARES = "DRA share claims"  # the holder of a card the DRA driver prepared shares of

@dataclass
class SolverState:
    cache: MappingCache = field(default_factory=MappingCache)
    spot_resource: str = "spot-gpu"
    health: dict[str, Health] = field(default_factory=dict)  # spot device -> desired health
    terminating: set[str] = field(default_factory=set)  # ShadowPods being deleted
    inventory: dict[str, tuple[str, ...]] = field(default_factory=dict)  # vendor resource -> cards
    shadow_cards: dict[str, tuple[str, ...]] = field(default_factory=dict)  # ShadowPod -> its real cards
    dra_shared: dict[str, tuple[str, ...]] = field(default_factory=dict)  # inventory -> cards DRA shares use
    lend_after: float = 0.0  # wall clock before which the inventory lends nothing (after a rebuild)
    evicting: dict[str, Victim] = field(default_factory=dict)  # pod -> what the cache knew of it
    evicted: Evicted = field(default_factory=Evicted)  # pods evicted lately
    kubelet: KubeletView | None = field(default_factory=KubeletView)  # None: unknown, nothing is lent
    withheld: set[str] = field(default_factory=set)  # cards lend_free did not lend for the kubelet's word
    clock: Callable[[], float] = time.time

    def take_out(self, pod: str, owner: str = "", uid: str = "", devices: Iterable[str] = (),
                 cards: Iterable[str] = ()) -> None:
        """Free every device ``pod`` uses and record it as a victim, with what the cache knew of
        it (its uid and devices; ``uid``/``devices`` name a pod the cache never had; ``cards``
        the real cards of a ShadowPod already forgotten)."""
        uses = self.cache.uses_of(pod)
        known = next((u.sharing_uid for u in uses if u.sharing_uid), "")
        owners = {self.cache.owner_of(u.id) or "" for u in uses}
        owner = owner or next(iter(sorted(owners)), "")
        self.evicting[pod] = Victim(uid=known or uid, devices=tuple(u.id for u in uses) or tuple(devices),
                                    owner=owner, since=self.clock(),
                                    cards=tuple(cards) or self.shadow_cards.get(owner, ()))
        self.cache.unuse_everywhere(pod)

    def kind_of(self, owner: str | None) -> str:
        entry = self.cache.get(owner) if owner else None
        return entry.kind if entry else ""

    def in_inventory(self, card: str) -> bool:
        """Whether the kubelet can allocate ``card`` (True while no inventory is known)."""
        return not self.inventory or any(card in cards for cards in self.inventory.values())

    def holder_of(self, card: str, active_only: bool = False) -> str | None:
        """The pod holding a real card: a reserved pod, an away owner (unless ``active_only``)
        or a ShadowPod; None when the card is free."""
        owner = self.cache.owner_of(card)
        kinds = (RESERVED,) if active_only else (RESERVED, SPOT_OWNER)
        if owner is not None and self.kind_of(owner) in kinds:
            return owner
        if any(card in cards for cards in self.dra_shared.values()):
            return DRA_SHARES
        return next((s for s, cards in sorted(self.shadow_cards.items()) if card in cards), None)

    def held_unknown(self, card: str) -> bool:
        """Whether the kubelet says a container holds ``card`` while the solver knows no holder of
        it (a pod not reported yet, the SharePods of a ShadowPod gone); True when it cannot say."""
        if self.kubelet is None:
            return True
        if self.holder_of(card) is not None:
            return False
        return card in self.kubelet.cards

    def still_held(self, shadow_pod: str) -> bool:
        """Whether some container still holds a virtual device of ``shadow_pod`` (True if unknown)."""
        return self.kubelet is None or shadow_pod in self.kubelet.shadows

    def lent(self) -> list[str]:
        entry = self.cache.get(IDLE_SPACE)
        return list(entry.devices) if entry else []

    def lend(self, spot_devices: list[str]) -> None:
        """Add spot devices to ``idle-space`` (users of devices already there are kept)."""
        current = self.lent()
        wanted = current + [d for d in spot_devices if d not in current]
        if wanted != current:
            self.cache.create(IDLE_SPACE, wanted, kind=IDLE_SPACE)

    def withdraw(self, spot_devices: list[str]) -> list[str]:
        """Take spot devices out of ``idle-space``; returns their borrowers (now freed everywhere)."""
        entry = self.cache.get(IDLE_SPACE)
        if entry is None:
            return []
        borrowers = sorted({entry.devices[d].sharing_pod for d in spot_devices
                            if d in entry.devices and entry.devices[d].sharing_pod})
        for borrower in borrowers:
            self.take_out(borrower, IDLE_SPACE)
        remaining = [d for d in entry.devices if d not in spot_devices]
        if not remaining:
            self.cache.delete(IDLE_SPACE)
        elif len(remaining) != len(entry.devices):
            self.cache.create(IDLE_SPACE, remaining, kind=IDLE_SPACE)
        return borrowers

    def borrowers(self) -> dict[str, str]:
        """spot device -> borrower, for every lent device in use."""
        entry = self.cache.get(IDLE_SPACE)
        if entry is None:
            return {}
        return {d: s.sharing_pod for d, s in entry.devices.items() if s.sharing_pod}

    def set_health(self, devices: list[str], health: Health) -> dict[str, Health]:
        """Record the desired health; returns the devices whose desired health this sets."""
        for device in devices:
            self.health[device] = health
        return dict.fromkeys(devices, health)

    def devices_of_resource(self, resource: str) -> tuple[str, ...]:
        found: list[str] = []
        for owner in self.cache.owners(SHADOW):
            entry = self.cache.get(owner)
            if entry is not None and entry.resource == resource and owner not in self.terminating:
                found.extend(entry.devices)
        return tuple(sorted(found))
