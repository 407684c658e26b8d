"""The node's ResourceSlice (resource.k8s.io/v1): every card, and the spot mirrors of lendable ones.

One pool per node (named after the node), one slice in it. Each card is a device with
attributes (kind ``card``, vendor resource, model, vendor ID, index, memory, and Kubernetes'
standard ``pcieRoot``, ``numaNode`` and ``pciBusID`` where sysfs tells them) and a
consumable capacity ``shares`` (the card's whole capacity unless a request asks for fewer)
that several claims may draw from (``allowMultipleAllocations``). An unhealthy card stays
listed with a ``NoSchedule`` taint. A card the solver lends (its spot device Healthy) also
appears as ``spot-<name>``, kind ``spot``: one whole card, for ``spot.gpushare.k8s.io``.
With slot kinds (unchanged pods asking ``gpushare/share-gpu-<N>``, :mod:`gpushare_common.dra`),
each card also has a slot device per kind, and a counter its devices draw on.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
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


def _draws_on_card(device: Obj, card: Card) -> Obj:
    """The device takes the card's one counter while allocated (KEP-4815)."""
    device["consumesCounters"] = [{"counterSet": dra.counter_set_name(card.id),
                                   "counters": {dra.CARD_COUNTER: {"value": "1"}}}]
    return device


def slot_device(card: Card, kind: str, spec: int) -> Obj:
    """One share kind's slots of a card (``share-gpu-<N>``): N, one per allocation."""
    attributes = {**_attributes(card, dra.KIND_SLOT), dra.ATTR_SHARE_KIND: {"string": kind},
                  dra.ATTR_SHARE_SPEC: {"int": spec}}
    device: Obj = {"name": dra.slot_device_name(card.id, kind, spec), "attributes": attributes,
                   "capacity": {dra.SLOTS: {"value": str(spec), "requestPolicy": dict(dra.SLOT_POLICY)}},
                   "allowMultipleAllocations": True}
    if not card.healthy:
        device["taints"] = [dict(UNHEALTHY_TAINT)]
    return _draws_on_card(device, card)


def devices(cards: Iterable[Card], shares: int, lendable: Collection[str],
            slot_kinds: Sequence[tuple[str, int]] = ()) -> list[Obj]:
    found: list[Obj] = []
    for card in cards:
        device = card_device(card, shares)
        found.append(_draws_on_card(device, card) if slot_kinds else device)
        found += [slot_device(card, kind, spec) for kind, spec in slot_kinds]
        if card.id in lendable:
            found.append(spot_device(card))
    return found


MAX_DEVICES = 64  # devices of one slice once they draw on counters or carry taints (the API's limit)


def _slice(node: str, driver: str, name: str, generation: int, count: int, content: Obj) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": driver}},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": count}, **content},
    }


def build_slice(node: str, driver: str, cards: list[Card], shares: int, lendable: Collection[str],
                generation: int) -> Obj:
    """The whole slice object (``metadata.resourceVersion`` is the publisher's business)."""
    return _slice(node, driver, slice_name(node, driver), generation, 1, {"devices": devices(cards, shares, lendable)})


def build_slices(node: str, driver: str, cards: list[Card], shares: int, lendable: Collection[str],
                 generation: int, slot_kinds: Sequence[tuple[str, int]] = ()) -> list[Obj]:
    """Every slice of the node's pool. With slot kinds, each card has a counter set of one
    counter its card device and its slot devices draw on (a card serves whole-card claims and
    shares, or one share kind's slots): the counter sets in a slice of their own (``-counters``)
    as the API wants them, the devices in slices of at most MAX_DEVICES."""
    if not slot_kinds:
        return [build_slice(node, driver, cards, shares, lendable, generation)]
    found = devices(cards, shares, lendable, slot_kinds)
    chunks = [found[i:i + MAX_DEVICES] for i in range(0, len(found), MAX_DEVICES)] or [[]]
    base, count = slice_name(node, driver), len(chunks) + 1
    counters = [{"name": dra.counter_set_name(c.id), "counters": {dra.CARD_COUNTER: {"value": "1"}}} for c in cards]
    return [_slice(node, driver, f"{base}-counters", generation, count, {"sharedCounters": counters}),
            *(_slice(node, driver, base if i == 0 else f"{base}-{i + 1}", generation, count, {"devices": chunk})
              for i, chunk in enumerate(chunks))]

