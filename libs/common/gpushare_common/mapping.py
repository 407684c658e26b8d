"""MappingCache: owner -> {device id -> DeviceStatus}, and ShareDeviceCount.

See docs/state-machines.md, 'Solver card states'.

Owners are ShadowPod keys (ShareGPU), dev-machine pod keys (SpotGPU) and the
special owner ``idle-space`` (spot devices lent out).  The cache is plain
in-memory state; :class:`PersistentMapping` mirrors every changed owner into a
JetStream key-value bucket so a restarted solver resumes where it stopped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:  # the store needs nats-py, which cluster services without NATS never load
    from .bus.kv import Store

IDLE_SPACE = "idle-space"
# the other owner kinds: a ShadowPod, a pod holding real cards, a dev machine whose owner is away
SHADOW, RESERVED, SPOT_OWNER = "shadow", "reserved", "spot-owner"


class MappingError(ValueError):
    def __init__(self, owner: str, device: str, reason: str) -> None:
        self.owner, self.device, self.reason = owner, device, reason
        super().__init__(f"mapping {owner!r} device {device!r}: {reason}")


class DeviceStatus(msgspec.Struct, kw_only=True):
    id: str
    sharing_pod: str = ""  # the user's pod (or pod/container) key; "" when free
    sharing_uid: str = ""  # the user pod's uid, when the event named it


class OwnerEntry(msgspec.Struct, kw_only=True):
    owner: str
    devices: dict[str, DeviceStatus] = {}
    kind: str = ""  # shadow | spot-owner | idle-space
    resource: str = ""


class MappingCache:
    def __init__(self) -> None:
        self._owners: dict[str, OwnerEntry] = {}
        self._device_owner: dict[str, str] = {}
        self.changed: set[str] = set()

    def create(self, owner: str, devices: Iterable[str], kind: str = "", resource: str = "") -> bool:
        """Create ``owner`` with ``devices`` (kept users survive a re-create); True if changed."""
        old = self._owners.get(owner)
        wanted = list(dict.fromkeys(devices))
        if old and list(old.devices) == wanted and (old.kind, old.resource) == (kind, resource):
            return False
        kept = old.devices if old else {}
        entry = OwnerEntry(owner=owner, kind=kind, resource=resource, devices={
            d: kept.get(d) or DeviceStatus(id=d) for d in wanted})
        if old:
            for device in old.devices:
                self._device_owner.pop(device, None)
        self._owners[owner] = entry
        for device in wanted:
            self._device_owner[device] = owner
        self.changed.add(owner)
        return True

    def _status(self, owner: str, device: str) -> DeviceStatus:
        entry = self._owners.get(owner)
        if entry is None:
            raise MappingError(owner, device, "unknown owner")
        status = entry.devices.get(device)
        if status is None:
            raise MappingError(owner, device, "device does not belong to this owner")
        return status

    def use(self, owner: str, user: str, device: str, uid: str = "") -> bool:
        status = self._status(owner, device)
        if status.sharing_pod == user and (not uid or status.sharing_uid == uid):
            return False
        if status.sharing_pod and status.sharing_pod != user:
            raise MappingError(owner, device, f"already used by {status.sharing_pod}")
        status.sharing_pod, status.sharing_uid = user, uid or status.sharing_uid
        self.changed.add(owner)
        return True

    def unuse(self, owner: str, user: str, device: str) -> bool:
        entry = self._owners.get(owner)
        status = entry.devices.get(device) if entry else None
        if status is None or status.sharing_pod != user:
            return False
        status.sharing_pod, status.sharing_uid = "", ""
        self.changed.add(owner)
        return True

    def uses_of(self, user: str) -> list[DeviceStatus]:
        """Every device ``user`` holds, with the uid it was recorded with."""
        return [s for e in self._owners.values() for s in e.devices.values() if s.sharing_pod == user]

    def unuse_everywhere(self, user: str) -> list[tuple[str, str]]:
        """Free every device ``user`` holds; returns (owner, device) pairs freed."""
        freed = []
        for entry in self._owners.values():
            for status in entry.devices.values():
                if status.sharing_pod == user:
                    status.sharing_pod, status.sharing_uid = "", ""
                    freed.append((entry.owner, status.id))
                    self.changed.add(entry.owner)
        return freed

    def users_of(self, owner: str) -> set[str]:
        entry = self._owners.get(owner)
        return {s.sharing_pod for s in entry.devices.values() if s.sharing_pod} if entry else set()

    def free_devices(self, owner: str) -> list[str]:
        entry = self._owners.get(owner)
        return [d for d, s in entry.devices.items() if not s.sharing_pod] if entry else []

    def owner_of(self, device: str) -> str | None:
        return self._device_owner.get(device)

    def get(self, owner: str) -> OwnerEntry | None:
        return self._owners.get(owner)

    def owners(self, kind: str | None = None) -> list[str]:
        return [o for o, e in self._owners.items() if kind is None or e.kind == kind]

    def delete(self, owner: str) -> OwnerEntry | None:
        entry = self._owners.pop(owner, None)
        if entry is not None:
            for device in entry.devices:
                if self._device_owner.get(device) == owner:
                    del self._device_owner[device]
            self.changed.add(owner)
        return entry

    def snapshot(self) -> dict[str, dict[str, str]]:
        """owner -> {device -> user or ""}: JSON-ready, for /status and tests."""
        return {
            owner: {d: s.sharing_pod for d, s in entry.devices.items()}
            for owner, entry in sorted(self._owners.items())
        }

    def load(self, entries: Iterable[OwnerEntry]) -> None:
        self._owners.clear()
        self._device_owner.clear()
        for entry in entries:
            self._owners[entry.owner] = entry
            for device in entry.devices:
                self._device_owner[device] = entry.owner
        self.changed.clear()


class PersistentMapping:
    """A MappingCache mirrored into a key-value bucket, one key per owner."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.cache = MappingCache()

    async def load(self) -> int:
        entries = await self.store.items(OwnerEntry)
        self.cache.load(entries.values())
        return len(entries)

    async def flush(self) -> int:
        """Write every changed owner (or delete it when gone); returns how many."""
        changed = sorted(self.cache.changed)
        for owner in changed:
            entry = self.cache.get(owner)
            if entry is None:
                await self.store.delete(owner)
            else:
                await self.store.put(owner, entry)
        self.cache.changed.difference_update(changed)
        return len(changed)


@dataclass(frozen=True, slots=True)
class QuotaKey:
    namespace: str
    kind: str  # share | share-dev
    spec: int  # N virtual devices per ShadowPod

    @property
    def resource(self) -> str:
        return f"{self.kind}-gpu-{self.spec}"


@dataclass(frozen=True, slots=True)
class ShareDeviceCount:
    """Per quota key: ``pipelining`` = -(SharePods pending for lack of devices),
    ``ready`` = free virtual devices (incl. ShadowPods created but not yet Running),
    ``releasing`` = devices of ShadowPods being deleted."""

    pipelining: int = 0
    ready: int = 0
    releasing: int = 0

    @property
    def delta(self) -> int:
        return self.pipelining + self.ready

    def shadow_pods_to_create(self, spec: int) -> int:
        """``ceil(-delta / N)`` when short of devices, else 0."""
        if spec < 1:
            raise ValueError(f"share spec must be >= 1, got {spec}")
        return (spec - 1 - self.delta) // spec if self.delta < 0 else 0
