"""The kmod-bridge's ``/status`` (its response model: ``/openapi.json``, ``/docs``)."""

from __future__ import annotations

from gpushare_common.http import Model, ServiceStatus


class Watched(Model):
    """A pid namespace the module watches."""

    pidns: int
    mode: str
    """watched (an owner's) or reserved."""
    pod: str
    container: str
    container_id: str
    role: str = ""
    """Where the detector placed its container: owner, sharer or borrower (the last two counted only)."""
    cards: list[str] = []
    shadow: str = ""
    """A sharer's ShadowPod."""


class LastNotice(Model):
    """The last owner-back the kernel reported."""

    pidns: int
    pid: int
    pod: str
    id: str
    """The id of the owner-back event published."""
    latency_ms: float
    """From the kernel's notice to the event stored in the stream."""


class KernelNamespace(Model):
    pidns: int
    pod: str
    flags: list[str]
    blocked: int
    """Callers blocked now."""
    hits: int
    """GPU calls counted."""
    notices: int
    releases: int
    timeouts: int
    holds: int


class Kernel(Model):
    """The module's last STATS reply."""

    entries: int
    max_entries: int
    notices_sent: int
    notices_dropped: int
    receiver_portid: int
    timeout_ms: int
    max_hold_ms: int
    namespaces: list[KernelNamespace]


class KmodBridgeStatus(ServiceStatus):
    """One node's kmod-bridge: the kernel link, the watch set, the last owner-back."""

    nats: bool
    """Connected to NATS."""
    node: str
    transport: str
    registered: bool
    """Registered with the kernel (the watch set re-sent)."""
    registrations: int
    last_error: str
    watch_set_unsaved: int
    """Entries the bucket has not taken yet."""
    watch_set: list[Watched]
    last_notice: LastNotice | dict[str, None]
    """Empty until the first owner-back."""
    holding: list[int]
    """Pid namespaces whose owner is held until the solver answers."""
    kernel: Kernel | None
