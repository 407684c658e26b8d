"""Every message gpushare sends over NATS: one tagged union of frozen msgspec structs.

Schema evolution (msgspec's rules): a new field always gets a default; a
field's type never changes; nothing here forbids unknown fields, so an older
reader accepts a newer message and ignores what it does not know.

A new value of a ``Literal`` is the exception: an older reader refuses the
whole message (it does not decode), so a writer may send the new value only
where it copes with that. ``KmodOp`` ``hold`` (added with kernel protocol 2)
is sent by the solver as a request: an older kmod-bridge drops it and never
answers, the solver's request times out, and the owner is released by the
kernel's own timeout as before.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal, TypeAlias

import msgspec


def new_id() -> str:
    return uuid.uuid4().hex


def now() -> float:
    return time.time()


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Common envelope: the node it concerns, a unique id (idempotency key), a timestamp."""

    node: str
    id: str = msgspec.field(default_factory=new_id)
    ts: float = msgspec.field(default_factory=now)


PodState = Literal["using", "cleared"]


class ShadowEvent(Event, frozen=True, kw_only=True, tag="shadow"):
    """A ShadowPod is running on the node with real cards, or is gone (``cleared``)."""

    shadow_pod: str  # <ns>/<name>
    state: Literal["running", "cleared"]
    resource: str = ""  # share resource without domain, e.g. share-gpu-4
    share_kind: str = "share"  # share | share-dev
    share_spec: int = 0
    container: str = "main"
    vendor_resource: str = ""
    devices: tuple[str, ...] = ()  # real device ids
    terminating: bool = False


class ShareEvent(Event, frozen=True, kw_only=True, tag="share"):
    """A SharePod's container holds virtual devices (``using``) or released them."""

    share_pod: str
    container: str
    resource: str  # e.g. share-gpu-4
    state: PodState
    devices: tuple[str, ...] = ()  # virtual device ids
    pod_uid: str = ""  # the SharePod's uid: an eviction verifies it before it kills


class ReservedEvent(Event, frozen=True, kw_only=True, tag="generic"):
    """A reserved pod (an ordinary pod, or a dev machine, holding real cards) holds them, or
    released them. Its wire tag and subject stay ``generic``, the name of older versions, so
    that readers of either version decode what the other writes (docs/events.md)."""

    pod: str
    container: str
    vendor_resource: str
    state: PodState
    devices: tuple[str, ...] = ()  # real device ids
    lendable: bool = False  # a dev machine whose idle cards may be lent
    pod_uid: str = ""


class SpotEvent(Event, frozen=True, kw_only=True, tag="spot"):
    """A spot pod holds spot devices, or released them."""

    pod: str
    container: str
    state: PodState
    devices: tuple[str, ...] = ()  # spot-<real id>
    priority: int = 0
    pod_uid: str = ""  # the borrower's uid: an eviction verifies it before it kills


class CardInventory(Event, frozen=True, kw_only=True, tag="inventory"):
    """Every card of a vendor resource the node's kubelet can allocate (pod-resources
    GetAllocatableResources), so that cards no pod holds can be lent (SpotGPU: "card
    unallocated -> spot device Healthy")."""

    vendor_resource: str
    devices: tuple[str, ...] = ()  # real device ids
    shared: tuple[str, ...] = ()  # of these, the cards DRA share claims use (the DRA driver's): not lendable


class LowPowerEvent(Event, frozen=True, kw_only=True, tag="lowpower"):
    """An owner is away (``using=False``) or back (``using=True``)."""

    owner: str  # pod key of the dev machine
    using: bool
    devices: tuple[str, ...] = ()  # the owner's real device ids
    containers: tuple[str, ...] = ()
    utilisation: float = 0.0
    reason: str = ""


class OwnerBackEvent(Event, frozen=True, kw_only=True, tag="ownerback"):
    """The kernel saw a GPU ioctl from a watched pid namespace."""

    pidns: int
    pid: int
    kernel_ts_ns: int
    pod: str = ""
    container: str = ""
    resolved: bool = False
    notice_to_publish_ms: float = 0.0


Health = Literal["Healthy", "Unhealthy"]


class DeviceHealth(Event, frozen=True, kw_only=True, tag="health"):
    """Desired health of a resource's devices; ``full`` replaces the whole set."""

    resource: str  # without domain, e.g. spot-gpu
    devices: dict[str, Health] = {}
    full: bool = False
    reason: str = ""


class HealthApplied(Event, frozen=True, kw_only=True, tag="health_applied"):
    """The device plugin's answer to a fence (a :class:`DeviceHealth` sent as a request on
    ``fence.<resource>``): the health it now serves for those devices. A device it reports
    Unhealthy is refused to every Allocate from now on."""

    resource: str
    devices: dict[str, Health] = {}  # each fenced device the plugin serves: its health now
    request_id: str = ""


class SpareCapacity(Event, frozen=True, kw_only=True, tag="capacity"):
    """Oversold CPU/memory a node can sell again (``gpushare/vcpu``, ``gpushare/vmem``)."""

    resource: str  # vcpu | vmem
    devices: int  # device count advertised
    unit: int  # millicores or bytes per device
    inputs: dict[str, float] = {}


KmodOp = Literal["add", "delete", "detect", "undetect", "release", "stats", "config", "hold"]
OWNER = "owner"  # the role of a container holding its cards itself (a reserved pod, a dev machine)


def counted_only(role: str) -> bool:
    """Whether a container of ``role`` is only counted (a sharer, a borrower, a role not known
    yet): never detected, held or taken for an owner's activity. "" is an entry no placement
    named (an older detector): an owner, as before placements existed."""
    return bool(role) and role != OWNER


class Placement(msgspec.Struct, frozen=True, kw_only=True):
    """Where gpushare placed one container (``ns/pod/container``), from the kubelet's
    pod-resources: ``role`` ``owner`` (a reserved pod or dev machine holding ``cards``),
    ``sharer`` (a SharePod on the virtual devices of ``shadow``, or a DRA share claim of
    ``cards``), ``borrower`` (a spot pod on the card behind its spot device)."""

    container: str
    role: str = OWNER
    cards: tuple[str, ...] = ()
    shadow: str = ""


class KmodCommand(Event, frozen=True, kw_only=True, tag="kmod_cmd"):
    """A request to the kmod-bridge; pods are pod keys or ``pod/container`` keys. An ``add``
    says in ``placements`` where each container sits: one that is not an owner's is counted
    only (the bridge refuses to detect or hold it)."""

    op: KmodOp
    pidns: tuple[int, ...] = ()
    pods: tuple[str, ...] = ()
    reason: str = ""
    placements: tuple[Placement, ...] = ()
    pids: tuple[int, ...] = ()  # ``stats``: host pids whose containers the reply names (``processes``)


class NamespaceStats(msgspec.Struct, frozen=True, kw_only=True):
    pidns: int
    container: str = ""  # the container of ``pod`` living in the namespace
    role: str = ""  # its Placement's role ("" when no placement named it)
    watched: bool = False
    need_notice: bool = False
    blocked: int = 0
    last_access_ns: int = 0
    hits: int = 0
    notices: int = 0
    pod: str = ""


class ProcessOwner(msgspec.Struct, frozen=True, kw_only=True):
    """The container a host pid runs in (``pod`` ``ns/name``), as the kmod-bridge resolves it."""

    pid: int
    pidns: int = 0
    pod: str = ""
    container: str = ""


class KmodReply(Event, frozen=True, kw_only=True, tag="kmod_reply"):
    """The kernel's answer: ``status`` 0 or a negative errno."""

    op: str
    status: int
    message: str = ""
    pidns: tuple[int, ...] = ()
    stats: tuple[NamespaceStats, ...] = ()
    kernel_now_ns: int = 0
    # the module's hold parameters as the kmod-bridge last read them from the kernel (0: not known);
    # the one source of every owner-back timer (gpushare_common.hold)
    timeout_ms: int = 0
    max_hold_ms: int = 0
    unresolved: tuple[str, ...] = ()  # pods of the command with no pid namespace found (add, detect)
    processes: tuple[ProcessOwner, ...] = ()  # the containers of the pids a ``stats`` named


class EvictionRecord(Event, frozen=True, kw_only=True, tag="eviction"):
    """One pod killed and evicted: why, and how long each step took."""

    pod: str
    reason: str  # owner-back | reserved | shadow-gone | pressure | ...
    owner: str = ""
    containers: tuple[str, ...] = ()
    kill_ms: float = 0.0
    delete_ms: float = 0.0
    total_ms: float = 0.0
    trigger_id: str = ""  # id of the event that caused it
    outcome: str = "evicted"  # evicted | already-gone | failed
    error: str = ""
    # from the trigger's handling to the moment every task of the pod had exited (kill_ms spans
    # the whole kill step, reading the pods from the API included); 0 when nothing was killed
    tasks_dead_ms: float = 0.0
    released_ms: float = 0.0  # from the trigger's handling to the owner's release sent (0: none)


class ContainerActivity(msgspec.Struct, frozen=True, kw_only=True):
    """One container gpushare placed on a card, and how much it uses it: the GPU calls the
    kernel module counted (None: not counted yet) and their rate between the detector's last
    two samples, and the exporter's figures for it where the exporter labels them by pod."""

    pod: str
    container: str
    role: str = OWNER
    cards: tuple[str, ...] = ()
    shadow: str = ""
    calls: int | None = None
    calls_per_s: float | None = None
    utilisation: float | None = None
    memory_used: float | None = None


class CardFigures(msgspec.Struct, frozen=True, kw_only=True):
    """One card's vendor figures as the exporter gives them (None: it did not say)."""

    utilisation: float | None = None  # percent
    memory_used: float | None = None  # bytes
    memory_total: float | None = None  # bytes


class GpuActivity(Event, frozen=True, kw_only=True, tag="activity"):
    """Every container gpushare placed on the node's cards, with its activity, and each card's
    own figures from the last fresh scrape (the detector, every scrape; a core message, not kept
    in the stream)."""

    containers: tuple[ContainerActivity, ...] = ()
    cards: dict[str, CardFigures] = {}  # vendor card ID -> its figures ({}: no fresh scrape)


AnyEvent: TypeAlias = (
    ShadowEvent
    | ShareEvent
    | ReservedEvent
    | SpotEvent
    | CardInventory
    | LowPowerEvent
    | OwnerBackEvent
    | DeviceHealth
    | HealthApplied
    | SpareCapacity
    | KmodCommand
    | KmodReply
    | EvictionRecord
    | GpuActivity
)

EVENT_TYPES: tuple[type[Event], ...] = (
    ShadowEvent,
    ShareEvent,
    ReservedEvent,
    SpotEvent,
    CardInventory,
    LowPowerEvent,
    OwnerBackEvent,
    DeviceHealth,
    HealthApplied,
    SpareCapacity,
    KmodCommand,
    KmodReply,
    EvictionRecord,
    GpuActivity,
)

_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[AnyEvent] = msgspec.json.Decoder(AnyEvent)


class EventDecodeError(ValueError):
    """A payload that is not a gpushare event: the reason names the field."""

    def __init__(self, reason: str, payload: bytes) -> None:
        self.reason = reason
        self.payload = payload[:200]
        super().__init__(f"undecodable event: {reason}")


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def decode(payload: bytes) -> AnyEvent:
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError as err:
        raise EventDecodeError(str(err), payload) from None


def event_tag(event: Event) -> str:
    return str(type(event).__struct_config__.tag)


def pod_of(event: Event) -> str:
    """The pod an event concerns, for filtering and logs ("" when none)."""
    for attr in ("pod", "shadow_pod", "share_pod", "owner"):
        value = getattr(event, attr, "")
        if value:
            return str(value)
    return ""
