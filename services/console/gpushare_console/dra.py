"""A DRA node's cards as Kubernetes has them: gpushare's ResourceSlices and the ResourceClaims
allocated from them (``resource.k8s.io/v1``, listed and watched like pods and nodes).

The solver's state names a DRA card's exclusive holder and its borrower (the detector reads
them from the kubelet's pod-resources), not its shares: a ``share`` claim holds no card of its
own there, so a card two claims of 25 shares run on reads idle and its spot mirror Healthy.
The API says it:

- each claim's allocation results name the driver, the pool (the node), the device and what
  it consumes (``consumedCapacity``: the card's ``shares``), its requests their device class,
  its ``status.reservedFor`` the pods it is reserved for;
- the node's slices name each device's card (attribute ``uuid``) and kind (``card``, its spot
  mirror ``spot``, a share kind's ``slot``); a card the driver finds unhealthy is tainted, and
  a card's spot mirror is listed only while it may be borrowed.

A card's spot mirror is ``lent`` while a ``spot`` claim holds it, ``Healthy`` while the slice
offers it, ``Unhealthy`` otherwise (not lendable: shared, its owner active, or taken back).
:func:`read_claim` and :func:`read_slice` decode one object or raise ValueError naming it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import msgspec
from gpushare_common import dra
from gpushare_common.cardmap import CardUse, card_order
from gpushare_common.mapping import RESERVED

LENT, HEALTHY, UNHEALTHY = "lent", "Healthy", "Unhealthy"
T = TypeVar("T")


# --- the API's shapes: only the fields read (the others are ignored) ----------------------


class _Meta(msgspec.Struct):
    name: str
    namespace: str = ""


class _Class(msgspec.Struct, rename="camel"):
    name: str = ""
    device_class_name: str = ""


class _Request(msgspec.Struct, rename="camel"):
    name: str
    exactly: _Class | None = None
    first_available: list[_Class] | None = None


class _Requests(msgspec.Struct):
    requests: list[_Request] | None = None


class _ClaimSpec(msgspec.Struct):
    devices: _Requests | None = None


class _Result(msgspec.Struct, rename="camel"):
    request: str
    driver: str
    pool: str
    device: str
    consumed_capacity: dict[str, str | int] | None = None


class _Results(msgspec.Struct):
    results: list[_Result] | None = None


class _Allocation(msgspec.Struct):
    devices: _Results | None = None


class _Reference(msgspec.Struct):
    resource: str = ""
    name: str = ""


class _ClaimStatus(msgspec.Struct, rename="camel"):
    allocation: _Allocation | None = None
    reserved_for: list[_Reference] | None = None


class _Claim(msgspec.Struct):
    metadata: _Meta
    spec: _ClaimSpec | None = None
    status: _ClaimStatus | None = None


class _Attribute(msgspec.Struct):
    string: str | None = None


class _Taint(msgspec.Struct):
    key: str = ""


class _Device(msgspec.Struct):
    name: str
    attributes: dict[str, _Attribute] | None = None
    taints: list[_Taint] | None = None


class _SliceSpec(msgspec.Struct, rename="camel"):
    driver: str
    node_name: str | None = None
    devices: list[_Device] | None = None


class _Slice(msgspec.Struct):
    metadata: _Meta
    spec: _SliceSpec


# --- what the console keeps -----------------------------------------------------------------


class ClaimDevice(msgspec.Struct, frozen=True, kw_only=True):
    """One of gpushare's devices allocated to a claim."""

    pool: str  # the node
    device: str
    device_class: str = ""  # the class its request named
    shares: int = 0  # the card's shares it consumes (0: none named)


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    namespace: str
    name: str
    devices: tuple[ClaimDevice, ...] = ()
    pods: tuple[str, ...] = ()  # the pods it is reserved for

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class SliceDevice(msgspec.Struct, frozen=True, kw_only=True):
    card: str  # the card's vendor ID
    kind: str  # card | spot | slot
    tainted: bool = False


class NodeSlice(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    node: str = ""
    devices: dict[str, SliceDevice] = {}  # device name -> its card


class CardClaim(msgspec.Struct, frozen=True, kw_only=True):
    """A claim on one card: what it is for (share | exclusive | spot), its pods, its shares."""

    claim: str
    role: str
    pods: tuple[str, ...] = ()
    shares: int = 0
    device: str = ""


class DraCard(msgspec.Struct, frozen=True, kw_only=True):
    card: str
    tainted: bool = False
    spot: str = UNHEALTHY  # its spot mirror: lent | Healthy | Unhealthy
    claims: tuple[CardClaim, ...] = ()


# --- reading ----------------------------------------------------------------------------


def object_key(doc: Mapping[str, Any]) -> str:
    """``namespace/name`` of a namespaced object, ``name`` of another; ValueError without a name."""
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(meta, Mapping) or not isinstance(name, str) or not name:
        raise ValueError("object without metadata.name")
    namespace = meta.get("namespace")
    return f"{namespace}/{name}" if isinstance(namespace, str) and namespace else name


def _convert(doc: Any, kind: type[T], what: str) -> T:
    try:
        return msgspec.convert(doc, kind)
    except msgspec.ValidationError as err:
        try:
            name = object_key(doc) if isinstance(doc, Mapping) else "?"
        except ValueError:
            name = "?"
        raise ValueError(f"{what} {name}: {err}") from None


def read_claim(doc: Any) -> Claim:
    """A ResourceClaim: gpushare's devices allocated to it and the pods it is reserved for."""
    claim = _convert(doc, _Claim, "ResourceClaim")
    namespace, name = claim.metadata.namespace, claim.metadata.name
    if not namespace or not name:
        raise ValueError(f"ResourceClaim {namespace}/{name}: no metadata.namespace or metadata.name")
    classes = _classes(claim.spec)
    status = claim.status or _ClaimStatus()
    allocated = status.allocation.devices if status.allocation is not None else None
    results = (allocated.results if allocated is not None else None) or []
    devices = tuple(ClaimDevice(pool=r.pool, device=r.device, device_class=classes.get(r.request, ""),
                                shares=_shares(f"{namespace}/{name}", r))
                    for r in results if r.driver == dra.DRIVER)  # fmt: skip
    pods = {f"{namespace}/{ref.name}" for ref in status.reserved_for or [] if ref.resource == "pods" and ref.name}
    return Claim(namespace=namespace, name=name, devices=devices, pods=tuple(sorted(pods)))


def _classes(spec: _ClaimSpec | None) -> dict[str, str]:
    """Request name (``<request>/<subrequest>`` for a first-available one) -> its device class."""
    found: dict[str, str] = {}
    for request in (spec.devices.requests if spec is not None and spec.devices is not None else None) or []:
        if request.exactly is not None:
            found[request.name] = request.exactly.device_class_name
        for sub in request.first_available or []:
            found[f"{request.name}/{sub.name}"] = sub.device_class_name
    return found


def _shares(claim: str, result: _Result) -> int:
    value = (result.consumed_capacity or {}).get(dra.SHARES)
    return 0 if value is None else dra.parse_count(value, f"ResourceClaim {claim}: consumedCapacity.{dra.SHARES}")


def read_slice(doc: Any) -> NodeSlice:
    """A ResourceSlice: each of gpushare's devices with its card and kind (another driver's: none)."""
    found = _convert(doc, _Slice, "ResourceSlice")
    if found.spec.driver != dra.DRIVER:
        return NodeSlice(name=found.metadata.name)
    devices = {d.name: SliceDevice(card=card, kind=kind, tainted=bool(d.taints)) for d in found.spec.devices or []
               if (card := _attribute(d, dra.ATTR_UUID)) and (kind := _attribute(d, dra.ATTR_KIND))}  # fmt: skip
    return NodeSlice(name=found.metadata.name, node=found.spec.node_name or "", devices=devices)


def _attribute(device: _Device, name: str) -> str:
    """A string attribute, named bare or qualified by the driver's domain ("" without it)."""
    attributes = device.attributes or {}
    value = attributes.get(name) or attributes.get(f"{dra.DRIVER}/{name}")
    return (value.string or "") if value is not None else ""


# --- a node's cards ---------------------------------------------------------------------


def node_cards(node: str, slices: Iterable[NodeSlice], claims: Iterable[Claim]) -> dict[str, DraCard]:
    """Each card of ``node``'s slices with the claims allocated from it ({}: not a DRA node)."""
    devices = {name: d for s in slices if s.node == node for name, d in s.devices.items()}
    cards = {d.card: d for d in devices.values() if d.kind == dra.KIND_CARD}
    if not cards:
        return {}
    named = {name: d.card for name, d in devices.items() if d.kind == dra.KIND_CARD}
    uses: dict[str, list[CardClaim]] = {}
    for claim in claims:
        for used in claim.devices:
            found = _card_of(used.device, devices, named) if used.pool == node else None
            if found is not None:
                use = CardClaim(claim=claim.key, role=_role(found[1], used), pods=claim.pods, shares=used.shares,
                                device=used.device)
                uses.setdefault(found[0], []).append(use)
    offered = {d.card for d in devices.values() if d.kind == dra.KIND_SPOT}
    return {card: _card(card, device.tainted, card in offered, uses.get(card, [])) for card, device in cards.items()}


def _card(card: str, tainted: bool, offered: bool, uses: list[CardClaim]) -> DraCard:
    spot = LENT if any(u.role == dra.ROLE_SPOT for u in uses) else HEALTHY if offered else UNHEALTHY
    return DraCard(card=card, tainted=tainted, spot=spot, claims=tuple(sorted(uses, key=lambda u: (u.claim, u.device))))


def _card_of(device: str, devices: Mapping[str, SliceDevice], named: Mapping[str, str]) -> tuple[str, str] | None:
    """(card, kind) of an allocated device: the slices', or a spot mirror they no longer offer
    (taken back while a claim still holds it)."""
    found = devices.get(device)
    if found is not None:
        return found.card, found.kind
    card = named.get(device.removeprefix(dra.SPOT_DEVICE_PREFIX)) if device.startswith(dra.SPOT_DEVICE_PREFIX) else None
    return (card, dra.KIND_SPOT) if card else None


def _role(kind: str, used: ClaimDevice) -> str:
    if kind == dra.KIND_SPOT:
        return dra.ROLE_SPOT
    if kind == dra.KIND_SLOT:
        return dra.ROLE_SHARE
    return dra.ROLE_OF_CLASS.get(used.device_class) or (dra.ROLE_SHARE if used.shares else dra.ROLE_EXCLUSIVE)


def with_claims(cards: list[CardUse], found: Mapping[str, DraCard]) -> list[tuple[CardUse, DraCard | None]]:
    """The solver's cards of a node, each as its claims make it (a card only the slices name
    joins them), in card order."""
    named = {c.card for c in cards}
    every = [*cards, *(CardUse(card=card, state="idle") for card in found if card not in named)]
    paired = [(_overlay(c, found[c.card]) if c.card in found else c, found.get(c.card)) for c in every]
    return sorted(paired, key=lambda pair: card_order(pair[0].card))


def _overlay(card: CardUse, found: DraCard) -> CardUse:
    """Shared by its share claims' pods, held by an exclusive claim's pod the solver does not
    name, lent to a spot claim's pod, unhealthy when the slice taints it; its spot mirror the
    slice's."""
    pods = {role: sorted({p for c in found.claims if c.role == role for p in c.pods}) for role in dra.ROLES}
    borrower = card.borrower or next(iter(pods[dra.ROLE_SPOT]), "")
    holder, kind = (card.holder, card.holder_kind) if card.holder or not pods[dra.ROLE_EXCLUSIVE] \
        else (pods[dra.ROLE_EXCLUSIVE][0], RESERVED)
    shared = any(c.role == dra.ROLE_SHARE for c in found.claims)
    state = "unhealthy" if found.tainted or card.state == "unhealthy" else "lent" if borrower \
        else "shared" if shared else "held" if kind == RESERVED else card.state
    return msgspec.structs.replace(card, state=state, holder=holder, holder_kind=kind, borrower=borrower,
                                   sharers=tuple(pods[dra.ROLE_SHARE]), spot_health=found.spot)


def pod_roles(found: Mapping[str, DraCard]) -> dict[str, list[str]]:
    """Pod -> what its claims on the node's cards are for (share, exclusive, spot)."""
    roles: dict[str, set[str]] = {}
    for card in found.values():
        for use in card.claims:
            for pod in use.pods:
                roles.setdefault(pod, set()).add(use.role)
    return {pod: sorted(kinds) for pod, kinds in roles.items()}
