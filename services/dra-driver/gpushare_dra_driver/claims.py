"""A ResourceClaim's allocation, as far as it concerns this driver on this node.

:func:`allocated` reads ``status.allocation.devices.results`` of a claim the kubelet asked to
prepare and returns the devices of this driver's pool (the node) with the role each plays
(``share``, ``exclusive`` or ``spot``) and the shares it consumes. Anything that does not add
up (another claim behind the UID, no allocation, a device this node does not have, consumed
shares that are no whole number within the card's capacity) is a :class:`ClaimError` naming
the claim, the field and why, and nothing is prepared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpushare_common import dra

from .cards import Card


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Allocated:
    """One device of the claim: which request it serves, the card, its role and shares."""

    request: str
    device: str
    card: Card
    role: str
    shares: int


class ClaimError(ValueError):
    """A claim that cannot be prepared: which claim, which field, why."""

    def __init__(self, claim: str, field: str, reason: str) -> None:
        self.claim = claim
        self.field = field
        self.reason = reason
        super().__init__(f"claim {claim}: {field}: {reason}" if field else f"claim {claim}: {reason}")


def _mapping(value: Any, claim: str, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ClaimError(claim, field, f"expected an object, got {type(value).__name__}")
    return value


def _classes(claim: Mapping[str, Any], key: str) -> dict[str, str]:
    """Request name -> its device class (``exactly`` requests and ``firstAvailable`` subrequests)."""
    devices = _mapping((claim.get("spec") or {}).get("devices") or {}, key, "spec.devices")
    found: dict[str, str] = {}
    for request in devices.get("requests") or []:
        if not isinstance(request, Mapping):
            continue
        name = str(request.get("name", ""))
        exactly = request.get("exactly")
        if isinstance(exactly, Mapping):
            found[name] = str(exactly.get("deviceClassName", ""))
        for sub in request.get("firstAvailable") or []:
            if isinstance(sub, Mapping):
                found[f"{name}/{sub.get('name', '')}"] = str(sub.get("deviceClassName", ""))
    return found


def _results(claim: Mapping[str, Any], key: str) -> list[Any]:
    status = _mapping(claim.get("status") or {}, key, "status")
    allocation = status.get("allocation")
    if not allocation:
        raise ClaimError(key, "status.allocation", "the claim is not allocated")
    devices = _mapping(_mapping(allocation, key, "status.allocation").get("devices") or {}, key,
                       "status.allocation.devices")
    results = devices.get("results")
    if not isinstance(results, list):
        raise ClaimError(key, "status.allocation.devices.results", "expected a list")
    return results


def _shares(result: Mapping[str, Any], key: str, where: str, capacity: int, spot: bool) -> int:
    consumed = result.get("consumedCapacity") or {}
    raw = _mapping(consumed, key, f"{where}.consumedCapacity").get(dra.SHARES)
    if spot:
        if raw is not None:
            raise ClaimError(key, f"{where}.consumedCapacity", "a spot device has no shares to consume")
        return capacity
    if raw is None:
        return capacity  # no consumable capacity recorded: the whole card
    try:
        shares = dra.parse_count(raw, "shares")
    except dra.DraNameError as err:
        raise ClaimError(key, f"{where}.consumedCapacity.{dra.SHARES}", err.reason) from None
    if not 1 <= shares <= capacity:
        raise ClaimError(key, f"{where}.consumedCapacity.{dra.SHARES}",
                         f"{shares} is outside [1, {capacity}] (the card's capacity)")
    return shares


def _role(request: str, classes: Mapping[str, str], spot: bool, shares: int, capacity: int) -> str:
    if spot:
        return dra.ROLE_SPOT
    role = dra.ROLE_OF_CLASS.get(classes.get(request, ""))
    if role in (dra.ROLE_SHARE, dra.ROLE_EXCLUSIVE):
        return role
    return dra.ROLE_EXCLUSIVE if shares == capacity else dra.ROLE_SHARE


Slots = Mapping[str, tuple[Card, str, int]]  # slot device -> (its card, share kind, N)


def _slot(result: Mapping[str, Any], key: str, where: str, capacity: int, spec: int) -> int:
    """A slot of a card split in N: the card's shares / N (one slot an allocation)."""
    raw = _mapping(result.get("consumedCapacity") or {}, key, f"{where}.consumedCapacity").get(dra.SLOTS, "1")
    try:
        taken = dra.parse_count(raw, "slots")
    except dra.DraNameError as err:
        raise ClaimError(key, f"{where}.consumedCapacity.{dra.SLOTS}", err.reason) from None
    if taken != 1:
        raise ClaimError(key, f"{where}.consumedCapacity.{dra.SLOTS}", f"{taken}: an allocation takes one slot")
    return max(capacity // spec, 1)


def allocated(claim: Mapping[str, Any], ref: ClaimRef, driver: str, pool: str,
              devices: Mapping[str, tuple[Card, bool]], capacity: int, slots: Slots | None = None) -> list[Allocated]:
    """This driver's devices of ``claim`` in ``pool``; ClaimError when any of them is wrong. A
    slot device is a share of its card (of ``capacity / N`` shares)."""
    slots = slots or {}
    meta = _mapping(claim.get("metadata") or {}, ref.key, "metadata")
    if meta.get("uid") != ref.uid:
        raise ClaimError(ref.key, "metadata.uid", f"is {meta.get('uid')!r}, the kubelet asked for "
                         f"{ref.uid!r} (the claim was deleted and created again)")
    classes, found = _classes(claim, ref.key), []
    for index, raw in enumerate(_results(claim, ref.key)):
        where = f"status.allocation.devices.results[{index}]"
        result = _mapping(raw, ref.key, where)
        if result.get("driver") != driver:
            continue
        if result.get("pool") != pool:
            raise ClaimError(ref.key, f"{where}.pool", f"{result.get('pool')!r} is not this node's pool {pool!r}")
        name = result.get("device")
        request = str(result.get("request", ""))
        if isinstance(name, str) and name in slots:
            card, _, spec = slots[name]
            found.append(Allocated(request, name, card, dra.ROLE_SHARE, _slot(result, ref.key, where, capacity, spec)))
            continue
        if not isinstance(name, str) or name not in devices:
            raise ClaimError(ref.key, f"{where}.device", f"unknown device {name!r} in pool {pool!r}")
        card, spot = devices[name]
        shares = _shares(result, ref.key, where, capacity, spot)
        found.append(Allocated(request, name, card, _role(request, classes, spot, shares, capacity), shares))
    if not found:
        raise ClaimError(ref.key, "status.allocation.devices.results",
                         f"no device of driver {driver} in pool {pool!r}")
    return found
