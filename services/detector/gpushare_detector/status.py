"""The detector's ``/status`` (its response model: ``/openapi.json``, ``/docs``)."""

from __future__ import annotations

from gpushare_common.http import Model, ServiceStatus


class Owner(Model):
    """A lendable dev machine's away/back state."""

    state: str
    for_s: float
    """Seconds in this state."""
    reason: str
    idle_for_s: float | None
    """Seconds its cards have been idle (None: in use)."""
    utilisation: float | None
    hits: int | None
    """GPU calls the kernel module counted (None: not known yet)."""
    devices: list[str]


class Scrape(Model):
    """The GPU exporter's last scrape."""

    url: str
    vendor: str
    last: None = None
    """Present (and null) until the first scrape."""
    age_s: float | None = None
    ok: bool | None = None
    error: str | None = None
    devices: int | None = None
    skipped: dict[str, int] | None = None
    """Metric lines skipped, by reason."""


class Kmod(Model):
    """The watch set sent to the kmod-bridge."""

    containers: list[str]
    pending: int
    """Containers still to be added or removed."""
    last_error: str
    roles: dict[str, int] = {}
    """Containers sent, by role: owner (detectable), sharer and borrower (counted only)."""


class Resource(Model):
    devices: int
    """The devices of spare capacity offered."""
    unit: int
    """Millicores or bytes per device."""
    inputs: dict[str, float]
    """The measurements it was computed from."""


class Capacity(Model):
    """The node's spare CPU and memory."""

    error: str
    age_s: float | None
    """Seconds since the last good measurement."""
    resources: dict[str, Resource]


class DetectorStatus(ServiceStatus):
    """One node's detector: its pods by class, the cards, the owners away or back, spare capacity."""

    node: str
    pods: dict[str, int]
    """Pods on the node by class (reserved, shadow, share, spot, batch, ordinary)."""
    facts: int
    """Facts published (one per pod gpushare knows)."""
    unpublished: int
    """Changes waiting for the stream."""
    card_inventory: dict[str, list[str]]
    """Vendor resource -> the cards the kubelet can allocate."""
    owners: dict[str, Owner]
    scrape: Scrape | None
    kmod: Kmod
    last_resync_age_s: float | None
    errors: dict[str, int]
    """Pods skipped, by reason."""
    capacity: Capacity
