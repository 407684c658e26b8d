"""The node's ResourceSlice (resource.k8s.io/v1): every card, and the spot mirrors of lendable ones.

One pool per node (named after the node), one slice in it. Each card is a device with
attributes (kind ``card``, vendor resource, model, vendor ID, index, memory, and Kubernetes'
standard ``pcieRoot``, ``numaNode`` and ``pciBusID`` where sysfs tells them) and a
consumable capacity ``shares`` (the card's whole capacity unless a request asks for fewer)
that several claims may draw from (``allowMultipleAllocations``). An unhealthy card stays
listed with a ``NoSchedule`` taint. A card the solver lends (its spot device Healthy) also
appears as ``spot-<name>``, kind ``spot``: one whole card, for ``spot.gpushare.k8s.io``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from gpushare_common import dra

from .cards import Card

Obj = dict[str, Any]
UNHEALTHY_TAINT = {"key": f"{dra.DRIVER}/unhealthy", "value": "true", "effect": "NoSchedule"}


def slice_name(node: str, driver: str) -> str:
    return f"{node}-{driver.replace('.', '-')}"


def _attributes(card: Card, kind: str) -> Obj:
    attributes: Obj = {
        dra.ATTR_KIND: {"string": kind},
        dra.ATTR_VENDOR: {"string": card.vendor},
        dra.ATTR_UUID: {"string": card.id},
        dra.ATTR_INDEX: {"int": card.index},
    }
    if card.model:
        attributes[dra.ATTR_MODEL] = {"string": card.model}
    if card.memory_mib:
        attributes[dra.ATTR_MEMORY] = {"int": card.memory_mib}
    topology = card.topology
    if topology.pci_bus_id:
        attributes[dra.PCI_BUS_ID] = {"string": topology.pci_bus_id}
    if topology.pcie_root:
        attributes[dra.PCIE_ROOT] = {"string": topology.pcie_root}
    if topology.numa_node is not None:
        attributes[dra.NUMA_NODE] = {"int": topology.numa_node}
    return attributes


def card_device(card: Card, shares: int) -> Obj:
    device: Obj = {
        "name": card.name,
        "attributes": _attributes(card, dra.KIND_CARD),
        "capacity": {dra.SHARES: {"value": str(shares), "requestPolicy": dra.share_policy(shares)}},
        "allowMultipleAllocations": True,
    }
    if not card.healthy:
        device["taints"] = [dict(UNHEALTHY_TAINT)]
    return device


def spot_device(card: Card) -> Obj:
    return {"name": card.spot_name, "attributes": _attributes(card, dra.KIND_SPOT)}


def lendable_cards(cards: Iterable[Card], spot_health: dict[str, str]) -> set[str]:
    """Cards whose spot device the solver wants Healthy (``spot-<id>`` in its desired health)."""
    return {c.id for c in cards if c.healthy and spot_health.get(f"spot-{c.id}") == "Healthy"}


def devices(cards: Iterable[Card], shares: int, lendable: Collection[str]) -> list[Obj]:
    found: list[Obj] = []
    for card in cards:
        found.append(card_device(card, shares))
        if card.id in lendable:
            found.append(spot_device(card))
    return found


def build_slice(node: str, driver: str, cards: list[Card], shares: int, lendable: Collection[str],
                generation: int) -> Obj:
    """The whole slice object (``metadata.resourceVersion`` is the publisher's business)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, driver), "labels": {"app.kubernetes.io/managed-by": driver}},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices(cards, shares, lendable),
        },
    }

