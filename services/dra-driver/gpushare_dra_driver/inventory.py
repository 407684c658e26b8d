"""The node's cards over time: the vendor plugins' lists in, cards and inventory events out.

A card once listed stays (unhealthy) while its vendor plugin is away, so that claims on it
keep a device to point at; a card the plugin no longer lists goes. Each change of a vendor's
card set, or of the cards its share claims use (``shared``: the solver lends none of them), is
one :class:`~gpushare_common.events.CardInventory` (the solver lends the cards no pod holds), its
id a hash of its content salted with the id of the inventory it replaces, as the detector makes
them: a republication keeps its id, a return to an earlier set does not.

Its ``vendor_resource`` is ``<driver>/<vendor resource>`` (``gpushare.k8s.io/nvidia.com/gpu``):
on a DRA node the kubelet knows no vendor card, so the detector's own inventory of the vendor
resource is empty; the solver counts a card in any inventory, so the two stand side by side.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace

import msgspec
from gpushare_common import dra
from gpushare_common import events as ev
from gpushare_common.adapters.vendorplugin import VendorCard, VendorCards

from .cards import Card, Topology, build_cards


class Inventory:
    def __init__(self, node: str, topology: Topology, memory_mib: Mapping[str, int],
                 models: Mapping[str, str], driver: str = dra.DRIVER) -> None:
        self.node = node
        self.driver = driver
        self.topology = topology
        self.memory_mib = dict(memory_mib)
        self.models = dict(models)
        self.listed: dict[str, dict[str, VendorCard]] = {}
        self.cards: list[Card] = []
        self.published: dict[str, ev.CardInventory] = {}
        self.error = ""

    def update(self, vendor: str, cards: VendorCards) -> bool:
        """One vendor plugin's full list (None: the plugin is away); True when the cards changed."""
        if cards is None:
            known = self.listed.get(vendor, {})
            self.listed[vendor] = {i: replace(c, healthy=False) for i, c in known.items()}
        else:
            self.listed[vendor] = dict(cards)
        built = build_cards(self.listed, self.topology, self.memory_mib, self.models)
        changed = built != self.cards
        self.cards = built
        return changed

    def slots(self, kinds: tuple[tuple[str, int], ...]) -> dict[str, tuple[Card, str, int]]:
        """Slot device name -> (its card, share kind, N)."""
        return {dra.slot_device_name(card.id, kind, spec): (card, kind, spec)
                for card in self.cards for kind, spec in kinds}

    def devices(self) -> dict[str, tuple[Card, bool]]:
        index: dict[str, tuple[Card, bool]] = {}
        for card in self.cards:
            index[card.name] = (card, False)
            index[card.spot_name] = (card, True)
        return index

    def events(self, shared: frozenset[str] = frozenset()) -> list[ev.CardInventory]:
        """The inventories that changed since the last call (``shared``: the cards with shares
        prepared)."""
        changed = []
        for vendor, found in sorted(self.listed.items()):
            cards = tuple(sorted(found))
            used = tuple(c for c in cards if c in shared)
            old = self.published.get(vendor)
            if old is not None and old.devices == cards and old.shared == used:
                continue
            event = ev.CardInventory(node=self.node, vendor_resource=f"{self.driver}/{vendor}", devices=cards,
                                     shared=used)
            body = ev.encode(msgspec.structs.replace(event, id="", ts=0.0)) + (old.id if old else "").encode()
            event = msgspec.structs.replace(event, id=hashlib.blake2b(body, digest_size=16).hexdigest())
            self.published[vendor] = event
            changed.append(event)
        return changed

    def current(self) -> list[ev.CardInventory]:
        return [self.published[v] for v in sorted(self.published)]
