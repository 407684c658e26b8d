"""The device plugin's ``/status`` (its response model: ``/openapi.json``, ``/docs``)."""

from __future__ import annotations

from gpushare_common.http import Model, ServiceStatus


class Logic(Model):
    """What one plugin serves: the fields of its kind (spot, share, capacity) only."""

    kind: str
    healthy: int
    unhealthy: int
    vendors: list[str] | None = None
    """spot: the vendors whose cards it lends."""
    borrowed: list[str] | None = None
    """spot: the devices lent now."""
    spec: int | None = None
    """share: the N of share-gpu-N."""
    shadow_pods: list[str] | None = None
    """share: the ShadowPods whose card it shares."""
    isolation: dict[str, str] | None = None
    """share: ShadowPod -> its isolation profile (or "soft share")."""
    unit: int | None = None
    """capacity: millicores or bytes per device."""


class Plugin(Model):
    resource: str
    socket: str
    state: str
    registered: bool
    healthy: int
    """Devices listed Healthy."""
    unhealthy: int
    watchers: int
    """Open ListAndWatch streams (the kubelet's)."""
    last_error: str
    logic: Logic


class DevicePluginStatus(ServiceStatus):
    """One node's device plugins: each resource's socket, registration and devices."""

    node: str
    kubelet_socket: str
    kubelet_generations: int
    """Times the kubelet's socket was created (a kubelet restart adds one)."""
    nats: bool
    """Connected to NATS."""
    plugins: list[Plugin]
