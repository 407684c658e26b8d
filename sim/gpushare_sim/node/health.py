"""DRA device health as the kubelet keeps it (``ResourceHealthStatus``, KEP-4680), pure.

Each registered driver that serves ``DRAResourceHealth`` streams the health of its devices;
:class:`DeviceHealth` keeps the last word per ``(driver, pool, device)`` and says which
devices changed, so the kubelet writes again the status of the pods using them. A device no
driver spoke of, or whose driver's stream ended, is ``Unknown``.

:func:`container_status` is a container's ``allocatedResourcesStatus`` as the kubelet writes
it: one entry per claim the container names (``claim:<entry>`` or ``claim:<entry>/<request>``)
listing every device of that claim, each by its first CDI device ID (else
``<driver>/<pool>/<device>``) with its health; entries without devices are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

HEALTHY, UNHEALTHY, UNKNOWN = "Healthy", "Unhealthy", "Unknown"
DeviceKey = tuple[str, str, str]  # driver, pool, device


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One device a driver prepared for a claim."""

    driver: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...] = ()

    @property
    def key(self) -> DeviceKey:
        return self.driver, self.pool, self.device

    @property
    def resource_id(self) -> str:
        return self.cdi_ids[0] if self.cdi_ids else f"{self.driver}/{self.pool}/{self.device}"


class DeviceHealth:
    def __init__(self) -> None:
        self._health: dict[DeviceKey, str] = {}

    def get(self, key: DeviceKey) -> str:
        return self._health.get(key, UNKNOWN)

    def update(self, driver: str, devices: Iterable[tuple[str, str, str]]) -> set[DeviceKey]:
        """A driver's report of ``(pool, device, health)``; the devices whose health changed."""
        changed = set()
        for pool, device, health in devices:
            key = (driver, pool, device)
            if self._health.get(key, UNKNOWN) != health:
                changed.add(key)
            self._health[key] = health
        return changed

    def clear(self, driver: str) -> set[DeviceKey]:
        """The driver's stream ended: its devices' health is no longer known."""
        gone = {key for key, health in self._health.items() if key[0] == driver and health != UNKNOWN}
        self._health = {key: health for key, health in self._health.items() if key[0] != driver}
        return gone


def container_status(claims: Iterable[tuple[str, str, Iterable[AllocatedDevice]]],
                     health: DeviceHealth) -> list[dict[str, Any]]:
    """``allocatedResourcesStatus`` of one container from its ``(entry, request, devices)``."""
    found: dict[str, list[dict[str, str]]] = {}
    for entry, request, devices in claims:
        name = f"claim:{entry}/{request}" if request else f"claim:{entry}"
        found[name] = [{"resourceID": d.resource_id, "health": health.get(d.key)} for d in devices]
    return [{"name": name, "resources": resources} for name, resources in found.items() if resources]


def with_resource_status(status: dict[str, Any], per_container: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """A pod status with each container's ``allocatedResourcesStatus`` (where it has any)."""
    for container in status.get("containerStatuses") or []:
        found = per_container.get(container.get("name", ""))
        if found:
            container["allocatedResourcesStatus"] = found
    return status
