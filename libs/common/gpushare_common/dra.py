"""gpushare's Dynamic Resource Allocation names: driver, device classes, devices, CDI names.

One place for the names the DRA driver publishes and the other parts read back:

- the driver ``gpushare.k8s.io``, its DeviceClasses ``share.``, ``exclusive.`` and
  ``spot.gpushare.k8s.io``, the consumable capacity ``shares`` (default 100 per card);
- a card's DRA device name (a DNS label) from its vendor ID, and its spot mirror's name;
- the CDI device a prepared claim gets for each device, ``gpushare.k8s.io/gpu=<role>.<claim
  uid>.<card>``: the runtime resolves it from the driver's spec file, and the detector reads
  the claim's holders back from it (the kubelet's pod-resources lists every container's CDI
  devices), so a dev machine holding a card through an ``exclusive`` claim is an owner and a
  ``spot`` claim a borrower, as on the device-plugin path.

Standard library only (and :mod:`.quantity`); every parser returns a value or raises :class:`DraNameError`.
"""

from __future__ import annotations

import hashlib

from . import quantity

DRIVER = "gpushare.k8s.io"
SHARE_CLASS = f"share.{DRIVER}"
EXCLUSIVE_CLASS = f"exclusive.{DRIVER}"
SPOT_CLASS = f"spot.{DRIVER}"
DEVICE_CLASSES = (SHARE_CLASS, EXCLUSIVE_CLASS, SPOT_CLASS)
SHARES = "shares"  # the consumable capacity of a card
DEFAULT_SHARES = 100

# attributes: the driver's own (qualified by the driver's domain) and Kubernetes' standard ones
ATTR_KIND = "kind"  # card | spot
ATTR_VENDOR = "vendor"  # the vendor resource, e.g. nvidia.com/gpu
ATTR_MODEL = "model"
ATTR_UUID = "uuid"  # the vendor's device ID
ATTR_INDEX = "index"
ATTR_MEMORY = "memoryMiB"
ATTR_PEERS = "peers"  # interconnect peers (vendor IDs, comma-separated) where the vendor exposes them
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
NUMA_NODE = "resource.kubernetes.io/numaNode"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
KIND_CARD = "card"
KIND_SPOT = "spot"

CDI_KIND = f"{DRIVER}/gpu"
ROLE_SHARE = "share"
ROLE_EXCLUSIVE = "exclusive"
ROLE_SPOT = "spot"
ROLES = (ROLE_SHARE, ROLE_EXCLUSIVE, ROLE_SPOT)
ROLE_OF_CLASS = {SHARE_CLASS: ROLE_SHARE, EXCLUSIVE_CLASS: ROLE_EXCLUSIVE, SPOT_CLASS: ROLE_SPOT}

SPOT_DEVICE_PREFIX = "spot-"
_LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_CDI_INNER = _ALNUM | frozenset("_.:-")
_UID_CHARS = frozenset("0123456789abcdefABCDEF-")
MAX_CARD_NAME = 63 - len(SPOT_DEVICE_PREFIX)


class DraNameError(ValueError):
    """A malformed DRA or CDI name: what, which value, why."""

    def __init__(self, what: str, value: object, reason: str) -> None:
        self.what = what
        self.value = value
        self.reason = reason
        super().__init__(f"invalid {what} {str(value)[:120]!r}: {reason}")


def is_dns_label(value: str) -> bool:
    return (0 < len(value) <= 63 and all(c in _LABEL_CHARS for c in value)
            and value[0] != "-" and value[-1] != "-")


def device_name(card: str) -> str:
    """The DRA device name of a card: its vendor ID lowercased, other characters as ``-``
    (``GPU-8a1b…`` -> ``gpu-8a1b…``); a hash when that is no DNS label of at most 58."""
    if not card:
        raise DraNameError("card ID", card, "empty")
    name = "".join(c if c in _LABEL_CHARS else "-" for c in card.lower()).strip("-")
    while "--" in name:
        name = name.replace("--", "-")
    if not name or len(name) > MAX_CARD_NAME or not is_dns_label(name):
        name = "gpu-" + hashlib.sha256(card.encode()).hexdigest()[:16]
    return name


def spot_device_name(card: str) -> str:
    return SPOT_DEVICE_PREFIX + device_name(card)


def valid_cdi_name(value: str) -> bool:
    """A CDI device name: starts and ends alphanumeric, ``_ . : -`` inside."""
    return (bool(value) and value[0] in _ALNUM and value[-1] in _ALNUM
            and all(c in _CDI_INNER for c in value))


def _check_uid(uid: str) -> str:
    if not (0 < len(uid) <= 64 and all(c in _UID_CHARS for c in uid)):
        raise DraNameError("claim UID", uid, "expected a UUID (hexadecimal digits and '-')")
    return uid


class CdiDevice:
    """One prepared device of one claim: its role, the claim's UID and the card's vendor ID."""

    __slots__ = ("card", "claim_uid", "role")

    def __init__(self, role: str, claim_uid: str, card: str) -> None:
        self.role = role
        self.claim_uid = claim_uid
        self.card = card

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CdiDevice) and (self.role, self.claim_uid, self.card) == (
            other.role, other.claim_uid, other.card)

    def __hash__(self) -> int:
        return hash((self.role, self.claim_uid, self.card))

    def __repr__(self) -> str:
        return f"CdiDevice({self.role!r}, {self.claim_uid!r}, {self.card!r})"

    @property
    def name(self) -> str:
        """The device's name inside the CDI spec."""
        return f"{self.role}.{self.claim_uid}.{self.card}"

    @property
    def qualified(self) -> str:
        """``gpushare.k8s.io/gpu=<role>.<uid>.<card>``, what the kubelet hands the runtime."""
        return f"{CDI_KIND}={self.name}"


def cdi_device(role: str, claim_uid: str, card: str) -> CdiDevice:
    """A checked CdiDevice; DraNameError names what cannot be part of a CDI name."""
    if role not in ROLES:
        raise DraNameError("role", role, f"expected one of {', '.join(ROLES)}")
    _check_uid(claim_uid)
    if not valid_cdi_name(card):
        raise DraNameError("card ID", card, "cannot be part of a CDI device name "
                           "(letters, digits, '_.:-', starting and ending alphanumeric)")
    return CdiDevice(role, claim_uid, card)


def parse_cdi_device(value: object) -> CdiDevice:
    """``gpushare.k8s.io/gpu=<role>.<uid>.<card>`` (or the name alone) -> CdiDevice."""
    if not isinstance(value, str):
        raise DraNameError("CDI device", value, f"expected a string, got {type(value).__name__}")
    kind, equals, name = value.rpartition("=")
    if equals and kind != CDI_KIND:
        raise DraNameError("CDI device", value, f"not of kind {CDI_KIND}")
    parts = name.split(".", 2)
    if len(parts) != 3:
        raise DraNameError("CDI device", value, "expected <role>.<claim uid>.<card>")
    return cdi_device(*parts)


def is_ours(value: str) -> bool:
    """Whether a qualified CDI device name is of this driver's kind."""
    return value.startswith(CDI_KIND + "=")


# --- consumable capacity (KEP-5075): what a request of a card's shares consumes ------------


def parse_count(value: object, what: str) -> int:
    """A whole, non-negative quantity (``"25"``, ``25``, ``"1k"``, ``"2Ki"``); DraNameError otherwise."""
    try:
        return quantity.parse_count(value, what)
    except quantity.QuantityError as err:
        raise DraNameError(what, value, err.reason) from None


def share_policy(capacity: int) -> dict[str, object]:
    """The request policy of a card's ``shares``: unrequested means the whole card, any whole
    number of shares from 1 to the capacity otherwise."""
    return {"default": str(capacity),
            "validRange": {"min": "1", "max": str(capacity), "step": "1"}}


def consumed(requested: int | None, capacity: int, policy: dict[str, object] | None) -> int | None:
    """The shares a request consumes under ``policy`` (None: the request violates it).

    No request: the policy's default (the whole capacity without a policy). Below ``min``:
    rounded up to it; between ``min`` and ``max``: rounded up to ``min + n*step``; above
    ``max`` or the capacity: violation.
    """
    rule = policy or {}
    if requested is None:
        requested = parse_count(rule.get("default", capacity), "requestPolicy.default")
    valid = rule.get("validRange")
    if isinstance(valid, dict):
        low = parse_count(valid.get("min", 0), "validRange.min")
        high = parse_count(valid["max"], "validRange.max") if "max" in valid else capacity
        step = parse_count(valid["step"], "validRange.step") if "step" in valid else 0
        requested = max(requested, low)
        if step:
            requested = low + -(-(requested - low) // step) * step
        if requested > high:
            return None
    return requested if requested <= capacity else None


# --- the DeviceClasses (k8s/chart renders these; tests/dra checks that both agree) ----------

CLASS_SELECTORS = {
    SHARE_CLASS: f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].{ATTR_KIND} == "{KIND_CARD}"',
    EXCLUSIVE_CLASS: f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].{ATTR_KIND} == "{KIND_CARD}"',
    SPOT_CLASS: f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].{ATTR_KIND} == "{KIND_SPOT}"',
}


def device_class(name: str) -> dict[str, object]:
    """One of gpushare's DeviceClasses: a card (``share``: a claim asks for ``shares``;
    ``exclusive``: the whole card), or a lendable card's spot mirror (``spot``)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "gpushare"}},
            "spec": {"selectors": [{"cel": {"expression": CLASS_SELECTORS[name]}}]}}


# --- unchanged pods (DRAExtendedResource, KEP-5004): extended resources as DeviceClasses ------
#
# A DeviceClass names the extended resource it serves (spec.extendedResourceName): a pod asking
# `gpushare/share-gpu-4: 1` gets, on a node without that resource in its allocatable, a claim of
# one device of the class. `spot-gpu` is the spot class (one spot mirror). A share kind
# (share-gpu-N, share-dev-gpu-N) is one slot of a card split in N: per card and kind the driver
# publishes a slot device of N `slots` (each allocation takes one) and every device of a card
# draws on the card's counter (KEP-4815), so a card serves one kind, or whole-card claims, at a
# time, as a ShadowPod card does on a device-plugin node.

KIND_SLOT = "slot"
ATTR_SHARE_KIND = "shareKind"  # share | share-dev
ATTR_SHARE_SPEC = "shareSpec"  # N
SLOTS = "slots"  # a slot device's consumable capacity: N, one per allocation
CARD_COUNTER = "card"  # each card's counter set has one counter: 1, drawn by each of its devices
SHARE_KINDS = {"share": "share-gpu", "share-dev": "share-dev-gpu"}  # kind -> resource token prefix
SPOT_RESOURCE = "spot-gpu"


def slot_device_name(card: str, kind: str, spec: int) -> str:
    """``<card device>-s<N>`` (share) or ``-d<N>`` (share-dev): at most 58 + 5 characters."""
    return f"{device_name(card)}-{'d' if kind == 'share-dev' else 's'}{spec}"


def counter_set_name(card: str) -> str:
    return f"counters-{device_name(card)}"[:63].rstrip("-")


def extended_class_name(kind: str, spec: int) -> str:
    """The DeviceClass of a share kind: ``share-gpu-4.gpushare.k8s.io``."""
    return f"{SHARE_KINDS[kind]}-{spec}.{DRIVER}"


SLOT_POLICY: dict[str, object] = {"default": "1", "validRange": {"min": "1", "max": "1", "step": "1"}}  # one a time


def extended_device_class(kind: str, spec: int, domain: str = "gpushare") -> dict[str, object]:
    """The DeviceClass behind ``<domain>/share-gpu-<N>`` (or ``share-dev-gpu-<N>``)."""
    attrs = f'device.attributes["{DRIVER}"]'
    selector = (f'device.driver == "{DRIVER}" && {attrs}.{ATTR_KIND} == "{KIND_SLOT}" && '
                f'{attrs}.{ATTR_SHARE_KIND} == "{kind}" && {attrs}.{ATTR_SHARE_SPEC} == {spec}')
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": extended_class_name(kind, spec), "labels": {"app.kubernetes.io/part-of": "gpushare"}},
            "spec": {"selectors": [{"cel": {"expression": selector}}],
                     "extendedResourceName": f"{domain}/{SHARE_KINDS[kind]}-{spec}"}}


def spot_extended_class(domain: str = "gpushare") -> dict[str, object]:
    """The spot class, serving ``<domain>/spot-gpu`` too."""
    found = device_class(SPOT_CLASS)
    spec = found["spec"]
    assert isinstance(spec, dict)
    spec["extendedResourceName"] = f"{domain}/{SPOT_RESOURCE}"
    return found


def device_classes(share_specs: tuple[int, ...] = (), dev_specs: tuple[int, ...] = (),
                   extended: bool = False, domain: str = "gpushare") -> list[dict[str, object]]:
    """Every DeviceClass of gpushare; with ``extended``, those serving its extended resources too
    (``spot-gpu`` by the spot class, a class per share kind: what the driver's slot devices serve)."""
    found = [device_class(name) for name in DEVICE_CLASSES if not (extended and name == SPOT_CLASS)]
    if not extended:
        return found
    return [*found, spot_extended_class(domain), *(extended_device_class("share", n, domain) for n in share_specs),
            *(extended_device_class("share-dev", n, domain) for n in dev_specs)]
