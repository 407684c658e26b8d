"""The DRA driver's ``/status`` (its response model: ``/openapi.json``, ``/docs``)."""

from __future__ import annotations

from gpushare_common.http import Model, ServiceStatus


class Registration(Model):
    socket: str
    registered: bool
    """The kubelet accepted the driver's registration."""
    error: str
    """Why it did not ("" when it did)."""


class Card(Model):
    id: str
    """The vendor plugin's id of the card."""
    device: str
    """The card's device name in the ResourceSlice."""
    vendor: str
    index: int
    healthy: bool
    pcie_root: str
    numa_node: int | None


class Prepared(Model):
    """A claim prepared on this node."""

    claim: str
    """namespace/name."""
    devices: list[str]
    roles: list[str]
    file: str
    """Its CDI spec."""


class MpsDaemon(Model):
    """The node's MPS control daemon, run by the driver while capped shares are prepared."""

    needed: bool
    """Capped shares are prepared: the daemon must run."""
    pid: int | None
    """Its process (None while it does not run)."""
    answers: bool
    """Its control socket answers."""
    starts: int
    """How many times the driver started it."""
    directory: str
    """Its pipe, log and shm directories' parent."""
    last_error: str


class DraStatus(ServiceStatus):
    """One node's DRA driver: its registration, the cards in its slice, the claims prepared."""

    node: str
    driver: str
    registration: Registration
    cards: list[Card]
    lendable: list[str]
    """Cards lent as spot devices now."""
    slice_generation: int
    prepared: dict[str, Prepared]
    """Claim uid -> what was prepared for it."""
    mps_daemon: MpsDaemon
    shares_per_card: int
    device_classes: list[str]
