"""Who uses each real card of a node, and what that makes of the card (one reading of the
solver's state, for the solver's metrics and the console).

The solver's state says it three ways: the MappingCache (reserved pods and away owners hold
real cards; ``idle-space`` lends ``spot-<card>`` devices to borrowers; a ShadowPod's virtual
devices go to SharePods), the real cards of each ShadowPod and the node's card inventory (its
journal, :class:`CardFacts`), and the desired health of the spot devices. A card is

- ``unhealthy``: the node's inventory is known and does not list it (the kubelet cannot
  allocate it);
- ``lent``: a borrower uses its spot device;
- ``shared``: a ShadowPod holds it (shared by the SharePods using the ShadowPod's devices), or
  DRA share claims use it (the DRA driver's inventory says which; their pods are the claims');
- ``held``: a reserved pod, or a dev machine whose owner is active, holds it;
- ``idle``: nobody holds it, or its owner is away, and nobody borrows it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import msgspec

from .ids import SPOT_PREFIX
from .mapping import IDLE_SPACE, RESERVED, SHADOW, SPOT_OWNER, MappingCache

CardState = Literal["held", "shared", "lent", "idle", "unhealthy"]
UserKind = Literal["owner", "sharer", "borrower"]
CARD_STATES: tuple[CardState, ...] = ("held", "shared", "lent", "idle", "unhealthy")
DRA_SHARES = "dra-shares"  # the holder kind of a card DRA share claims use
_DIGITS = re.compile(r"(\d+)")


class CardFacts(msgspec.Struct, kw_only=True):
    """What the solver's journal (key ``<node>.journal.state`` of its bucket) says about cards:
    the cards the kubelet can allocate, per vendor resource, and each ShadowPod's real cards.
    The journal has more fields; decoding it as this struct reads these two only."""

    inventory: dict[str, list[str]] = {}
    shadow_cards: dict[str, list[str]] = {}
    dra_shared: dict[str, list[str]] = {}  # inventory -> the cards DRA share claims use


class CardUse(msgspec.Struct, frozen=True, kw_only=True):
    card: str
    state: CardState
    holder: str = ""  # the pod holding the card: a reserved pod, a dev machine or a ShadowPod
    holder_kind: str = ""  # reserved | spot-owner | shadow | dra-shares ("" when nobody holds it)
    sharers: tuple[str, ...] = ()  # SharePods using the holding ShadowPod's virtual devices
    share_devices: int = 0  # the ShadowPod's virtual devices (N of share-gpu-N)
    borrower: str = ""  # the spot pod borrowing it
    spot_health: str = ""  # desired health of its spot device ("" when never set)

    def users(self) -> list[tuple[str, UserKind]]:
        """Every pod using the card with how: its holder, the SharePods, the borrower."""
        found: list[tuple[str, UserKind]] = [(self.holder, "owner")] if self.holder else []
        found += [(pod, "sharer") for pod in self.sharers]
        return found + ([(self.borrower, "borrower")] if self.borrower else [])


def card_order(card: str) -> tuple[object, ...]:
    """Sort key: ``GPU-node-2`` before ``GPU-node-10``."""
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(card))


def _real(spot_device: str) -> str:
    return spot_device[len(SPOT_PREFIX):] if spot_device.startswith(SPOT_PREFIX) else ""


def _known_cards(cache: MappingCache, inventory: Iterable[str], shadow_cards: Mapping[str, Sequence[str]],
                 spot_health: Mapping[str, str]) -> list[str]:  # fmt: skip
    cards = [*inventory, *(c for cs in shadow_cards.values() for c in cs)]
    for owner in cache.owners():
        entry = cache.get(owner)
        if entry is not None and entry.kind in (RESERVED, SPOT_OWNER):
            cards += list(entry.devices)
        elif entry is not None and entry.kind == IDLE_SPACE:
            cards += [_real(d) for d in entry.devices]
    cards += [_real(d) for d in spot_health]
    return sorted({c for c in cards if c}, key=card_order)


def _holders(cache: MappingCache, shadow_cards: Mapping[str, Sequence[str]],
             dra_shared: Iterable[str]) -> dict[str, tuple[str, str]]:
    """card -> (holder, its kind); a ShadowPod counts before a stale reserved entry; a card DRA
    share claims use has no holder pod (the claims' pods share it)."""
    held: dict[str, tuple[str, str]] = {card: ("", DRA_SHARES) for card in dra_shared}
    for owner in cache.owners():
        entry = cache.get(owner)
        if entry is not None and entry.kind in (RESERVED, SPOT_OWNER):
            held.update({card: (owner, entry.kind) for card in entry.devices})
    for shadow, cards in shadow_cards.items():
        held.update({card: (shadow, SHADOW) for card in cards})
    return held


def _state(card: str, holder_kind: str, borrower: str, inventory: set[str]) -> CardState:
    if inventory and card not in inventory:
        return "unhealthy"
    if borrower:
        return "lent"
    if holder_kind in (SHADOW, DRA_SHARES):
        return "shared"
    return "held" if holder_kind == RESERVED else "idle"


def card_map(cache: MappingCache, inventory: Mapping[str, Sequence[str]],
             shadow_cards: Mapping[str, Sequence[str]], spot_health: Mapping[str, str],
             dra_shared: Mapping[str, Sequence[str]] | None = None) -> list[CardUse]:  # fmt: skip
    """Every card the state names, in card order, with its users and state (``dra_shared``: per
    inventory, the cards DRA share claims use)."""
    stock = {c for cards in inventory.values() for c in cards}
    holders = _holders(cache, shadow_cards, (c for cards in (dra_shared or {}).values() for c in cards))
    lent = cache.get(IDLE_SPACE)
    found: list[CardUse] = []
    for card in _known_cards(cache, stock, shadow_cards, spot_health):
        holder, kind = holders.get(card, ("", ""))
        spot = SPOT_PREFIX + card
        status = lent.devices.get(spot) if lent is not None else None
        borrower = status.sharing_pod if status is not None else ""
        shadow = cache.get(holder) if kind == SHADOW else None
        sharers = tuple(sorted({s.sharing_pod for s in shadow.devices.values() if s.sharing_pod})) \
            if shadow is not None else ()
        found.append(CardUse(card=card, state=_state(card, kind, borrower, stock), holder=holder,
                             holder_kind=kind, sharers=sharers, borrower=borrower,
                             share_devices=len(shadow.devices) if shadow is not None else 0,
                             spot_health=str(spot_health.get(spot, ""))))  # fmt: skip
    return found
