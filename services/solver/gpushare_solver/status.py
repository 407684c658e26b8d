"""The solver's ``/status`` (its response model: ``/openapi.json``, ``/docs``)."""

from __future__ import annotations

from gpushare_common.http import Model, ServiceStatus


class Evicting(Model):
    """What the mapping cache knew of a pod taken out of it to be evicted."""

    uid: str
    devices: list[str]
    """The devices it used (of ``owner``)."""
    owner: str
    since: float
    """When it was taken out (Unix time)."""


class Reclaim(Model):
    reason: str
    owner: str
    pods: list[str]
    killed: bool
    released: bool
    """The owner was released (the kmod-bridge confirmed)."""


class PlanView(Model):
    """A plan being carried out (persisted before it runs)."""

    trigger: str
    """The id of the event that made it."""
    event: str
    done: int
    """Actions finished."""
    actions: int
    reclaims: list[Reclaim]


class Pressure(Model):
    """The pressure watch: the last capacity sample as it judged it."""

    samples: int
    memory_threshold: float
    cpu_threshold: float
    memory_used_ratio: float | None
    cpu_used_ratio: float | None
    over: list[str]
    """The resources over their threshold in the last sample."""
    since_last_eviction_s: float | None
    cooldown_s: float
    evicted: list[str]
    """The last pods evicted under pressure, in eviction order."""


class SolverStatus(ServiceStatus):
    """One node's solver: who uses which card, what it is evicting, its pressure watch."""

    node: str
    mapping: dict[str, dict[str, str]]
    """Owner -> device -> the pod using it ("" when free)."""
    borrowers: dict[str, str]
    """Lent (spot) device -> the borrower using it."""
    spot_health: dict[str, str]
    """Spot device -> the desired health the solver published."""
    terminating_shadow_pods: list[str]
    evicting: dict[str, Evicting]
    card_inventory: dict[str, list[str]]
    """Vendor resource -> the node's cards (the detector's inventory)."""
    shadow_cards: dict[str, list[str]]
    """ShadowPod -> the cards it holds."""
    dra_shared: dict[str, list[str]]
    """DRA driver's inventory -> the cards its share claims use (held, not lent)."""
    evictions_in_flight: list[PlanView]
    pressure: Pressure
