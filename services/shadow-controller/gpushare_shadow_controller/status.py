"""The shadow-controller's ``/status`` (its response model: ``/openapi.json``, ``/docs``)."""

from __future__ import annotations

from gpushare_common.http import Model, ServiceStatus


class Quota(Model):
    """One namespace's share resource: its ShadowPods by state, and what the last plan changes."""

    pipelining: int
    """Being created."""
    ready: int
    releasing: int
    delta: int
    """ShadowPods the last plan adds (or retires, below 0)."""


class Shadow(Model):
    node: str
    phase: str
    terminating: bool
    users: int
    """SharePods using it."""
    idle_since: float | None


class Decision(Model):
    at: float
    action: str
    """create, delete or error."""
    target: str
    quota: str
    reason: str


class Caps(Model):
    mps_daemons_down: list[str]
    """ShadowPods whose MPS daemon is not ready."""
    not_enforced: list[str]
    """SharePods whose caps are not enforced (their card's daemon is down)."""


class ShadowControllerStatus(ServiceStatus):
    """The ShadowPod controller: leadership, quotas, the ShadowPods and its last decisions."""

    identity: str
    """This replica's name in the Lease."""
    leader: bool
    quota: dict[str, Quota]
    """namespace/resource -> its ShadowPods."""
    shadow_pods: dict[str, Shadow]
    pending_creations: list[str]
    """Created ShadowPods the watch has not shown yet."""
    decisions: list[Decision]
    caps: Caps
