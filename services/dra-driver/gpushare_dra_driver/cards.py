"""The node's cards as the driver publishes them: from the vendor plugins' lists, with topology.

The one source of the node's cards on a DRA node is the vendor's device plugin, read as a
client (its ListAndWatch: IDs, health, NUMA nodes), the way gpushare's spot plugin reads it;
sysfs, through the vendor table, adds each card's PCI address, NUMA node and PCIe root.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpushare_common import dra
from gpushare_common.adapters.vendorplugin import VendorCard
from gpushare_common.topology import CardTopology

Topology = Callable[[str, str], CardTopology]  # (vendor resource, card ID) -> topology


@dataclass(frozen=True, slots=True)
class Card:
    id: str
    vendor: str
    index: int
    healthy: bool
    topology: CardTopology = field(default_factory=CardTopology)
    memory_mib: int | None = None
    model: str = ""

    @property
    def name(self) -> str:
        return dra.device_name(self.id)

    @property
    def spot_name(self) -> str:
        return dra.spot_device_name(self.id)

    @property
    def numa_node(self) -> int | None:
        return self.topology.numa_node


class CardError(ValueError):
    """Cards the driver cannot publish (names that collide, IDs no CDI name can carry)."""


def build_cards(listed: Mapping[str, Mapping[str, VendorCard]], topology: Topology,
                memory_mib: Mapping[str, int], models: Mapping[str, str]) -> list[Card]:
    """Every card of every vendor plugin, indexed per vendor in PCI order (then by ID); the
    NUMA node from sysfs, else from the plugin's TopologyInfo."""
    cards: list[Card] = []
    for vendor, found in sorted(listed.items()):
        located = {card_id: topology(vendor, card_id) for card_id in found}
        order = sorted(located, key=lambda c: (located[c].pci_bus_id or "~", c))
        for index, card_id in enumerate(order):
            seen, where = found[card_id], located[card_id]
            if where.numa_node is None and seen.numa_nodes:
                where = CardTopology(where.pci_bus_id, seen.numa_nodes[0], where.pcie_root)
            cards.append(Card(card_id, vendor, index, seen.healthy, where, memory_mib.get(vendor),
                              models.get(vendor, "")))
    check_cards(cards)
    return cards


def check_cards(cards: list[Card]) -> None:
    names: dict[str, str] = {}
    for card in cards:
        if not dra.valid_cdi_name(card.id):
            raise CardError(f"card {card.id!r} of {card.vendor}: its ID cannot be part of a CDI device name")
        other = names.setdefault(card.name, card.id)
        if other != card.id:
            raise CardError(f"cards {other!r} and {card.id!r} have the same DRA device name {card.name!r}")
