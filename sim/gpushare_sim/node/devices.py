"""The device manager's bookkeeping: which devices each resource has, which are
healthy, and which container holds which device.

Pure state, no I/O.  The one rule it guards: a device ID is never recorded for
two live containers at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


class DeviceConflict(Exception):
    """Devices asked for are already held by another container, or do not exist."""

    def __init__(self, resource: str, device_ids: list[str], reason: str) -> None:
        self.resource = resource
        self.device_ids = device_ids
        super().__init__(f"{resource} devices {device_ids}: {reason}")


@dataclass(frozen=True, slots=True)
class ContainerKey:
    pod_uid: str
    namespace: str
    pod: str
    container: str


@dataclass
class DeviceTable:
    # resource -> device id -> healthy
    resources: dict[str, dict[str, bool]] = field(default_factory=dict)
    # container -> resource -> device ids
    allocations: dict[ContainerKey, dict[str, list[str]]] = field(default_factory=dict)

    def set_devices(self, resource: str, devices: dict[str, bool]) -> None:
        self.resources[resource] = dict(devices)

    def mark_all_unhealthy(self, resource: str) -> None:
        devices = self.resources.get(resource, {})
        self.resources[resource] = dict.fromkeys(devices, False)

    def drop_resource(self, resource: str) -> None:
        self.resources.pop(resource, None)

    def capacity(self) -> dict[str, int]:
        return {r: len(d) for r, d in self.resources.items()}

    def allocatable(self) -> dict[str, int]:
        return {r: sum(d.values()) for r, d in self.resources.items()}

    def in_use(self, resource: str) -> set[str]:
        return {i for held in self.allocations.values() for i in held.get(resource, [])}

    def free(self, resource: str) -> list[str]:
        used = self.in_use(resource)
        devices = self.resources.get(resource, {})
        return sorted(i for i, healthy in devices.items() if healthy and i not in used)

    def record(self, key: ContainerKey, resource: str, device_ids: list[str]) -> None:
        known = self.resources.get(resource, {})
        missing = [i for i in device_ids if i not in known]
        if missing:
            raise DeviceConflict(resource, missing, "not advertised by any plugin")
        taken = sorted(self.in_use(resource) & set(device_ids))
        if taken or len(set(device_ids)) != len(device_ids):
            raise DeviceConflict(resource, taken or device_ids, "already allocated")
        self.allocations.setdefault(key, {})[resource] = list(device_ids)

    def release_pod(self, pod_uid: str) -> list[ContainerKey]:
        keys = [k for k in self.allocations if k.pod_uid == pod_uid]
        for key in keys:
            del self.allocations[key]
        return keys

    def devices_of(self, key: ContainerKey) -> dict[str, list[str]]:
        return dict(self.allocations.get(key, {}))

    def holders(self) -> Iterable[tuple[ContainerKey, dict[str, list[str]]]]:
        return sorted(self.allocations.items(), key=lambda kv: (kv[0].namespace, kv[0].pod))

    def snapshot(self) -> dict[str, object]:
        return {
            "resources": {
                r: {i: ("Healthy" if h else "Unhealthy") for i, h in sorted(d.items())}
                for r, d in sorted(self.resources.items())
            },
            "allocations": [
                {"namespace": k.namespace, "pod": k.pod, "container": k.container, "devices": v}
                for k, v in self.holders()
            ],
        }
