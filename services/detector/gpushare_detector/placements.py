"""Which containers gpushare placed on which real cards, from the detector's published facts and
the kubelet's pod-resources answers (never from annotations). Pure functions.

- owner: a reserved pod or a dev machine (``ReservedEvent``): its own cards;
- sharer: a SharePod (``ShareEvent``): the cards of the ShadowPod whose virtual devices it got
  (``<ns>/<shadowpod>-<i>``), or the card of a DRA share claim (its CDI device);
- borrower: a spot pod (``SpotEvent``): the card behind its ``spot-<card>`` device.

A container placed twice keeps the first role of owner, sharer, borrower, with every card.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TypeVar

import msgspec
from gpushare_common import dra, ids
from gpushare_common import events as ev

from .model import NodeDevicesIn

ROLES = (ev.OWNER, "sharer", "borrower")
T = TypeVar("T")


def placements(facts: Iterable[ev.Event], devices: NodeDevicesIn) -> dict[str, ev.Placement]:
    """Every container placed on a card, by ``ns/pod/container``."""
    facts = list(facts)
    shadows = {e.shadow_pod: e.devices for e in facts if isinstance(e, ev.ShadowEvent)}
    found: dict[str, ev.Placement] = {}
    for event in facts:
        for where in _placed(event, shadows):
            _add(found, where)
    for pod, containers in devices.items():
        for container, resources in containers.items():
            cards = _share_claim_cards(resources.get(dra.CDI_KIND, ()))
            if cards:
                _add(found, ev.Placement(container=f"{pod}/{container}", role="sharer", cards=cards))
    return found


def _placed(event: ev.Event, shadows: Mapping[str, tuple[str, ...]]) -> Iterator[ev.Placement]:
    match event:
        case ev.ReservedEvent():
            yield ev.Placement(container=f"{event.pod}/{event.container}", cards=event.devices)
        case ev.ShareEvent():
            owners = sorted({d.shadow_key for d in _parsed(event.devices, ids.parse_share_device_id)})
            cards = tuple(sorted({c for s in owners for c in shadows.get(s, ())}))
            yield ev.Placement(container=f"{event.share_pod}/{event.container}", role="sharer", cards=cards,
                               shadow=owners[0] if owners else "")
        case ev.SpotEvent():
            cards = tuple(sorted(set(_parsed(event.devices, ids.parse_spot_device_id))))
            yield ev.Placement(container=f"{event.pod}/{event.container}", role="borrower", cards=cards)


def _parsed(values: Iterable[str], parse: Callable[[str], T]) -> list[T]:
    """The values that parse (a device id of another shape names no card)."""
    found: list[T] = []
    for value in values:
        try:
            found.append(parse(value))
        except ids.IdError:
            continue
    return found


def _share_claim_cards(names: Iterable[str]) -> tuple[str, ...]:
    cards: set[str] = set()
    for name in names:
        try:
            device = dra.parse_cdi_device(name)
        except dra.DraNameError:
            continue
        if device.role == dra.ROLE_SHARE:
            cards.add(device.card)
    return tuple(sorted(cards))


def _add(found: dict[str, ev.Placement], where: ev.Placement) -> None:
    old = found.get(where.container)
    if old is None:
        found[where.container] = where
        return
    first = min(old, where, key=lambda p: ROLES.index(p.role) if p.role in ROLES else len(ROLES))
    cards = tuple(sorted({*old.cards, *where.cards}))
    found[where.container] = msgspec.structs.replace(first, cards=cards, shadow=old.shadow or where.shadow)
