"""What every plugin's logic shares: the board, request checks, signed annotations."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpushare_common import ids

from ..devices import HEALTHY, DeviceBoard, Health
from ..errors import invalid, not_found, refused

Annotations = dict[str, str]
MAX_IDS_PER_REQUEST = 4096


@dataclass(frozen=True, slots=True)
class PreferredRequest:
    """One container of a GetPreferredAllocation call, as the kubelet sends it."""

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


class Signer:
    """Signs runtime annotations (v2: kind, node, target ``*``, value) with the node key."""

    def __init__(self, key: bytes, node: str) -> None:
        self._key = key
        self.node = ids.check_node_name(node)

    def annotations(self, kind: str, value: str) -> Annotations:
        target = ids.ANY_TARGET
        return {
            ids.ANNOTATION_PREFIXES[kind] + target: value,
            ids.signature_annotation(kind, target): ids.sign(self._key, kind, self.node, target, value),
        }


class PluginLogic:
    """Base of every plugin kind; subclasses fill the board and implement ``_allocate``."""

    kind = "base"

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self.board = DeviceBoard()
        self.desired: dict[str, Health] = {}

    def allocate(self, containers: Sequence[Sequence[str]]) -> list[Annotations]:
        if not containers:
            raise invalid(self.resource, "Allocate without container requests")
        return [self._allocate(self.checked_ids(request)) for request in containers]

    def preferred(self, requests: Sequence[PreferredRequest]) -> list[list[str]]:
        if not requests:
            raise invalid(self.resource, "GetPreferredAllocation without container requests")
        return [self._choose(check_preferred(self.resource, r), r) for r in requests]

    def checked_ids(self, request: Sequence[str]) -> list[str]:
        """Non-empty, unique, known and Healthy device IDs, else a typed error."""
        if not request:
            raise invalid(self.resource, "container request without device IDs")
        if len(request) > MAX_IDS_PER_REQUEST or len(set(request)) != len(request):
            raise invalid(self.resource, "device IDs must be unique (and fewer than 4096)")
        for device_id in request:
            self.check_known(device_id)
        return list(request)

    def check_known(self, device_id: str) -> None:
        health = self.board.health(device_id)
        if health is None:
            raise not_found(self.resource, f"unknown device {device_id!r}")
        if health != HEALTHY:
            raise refused(self.resource, f"device {device_id!r} is Unhealthy")

    def apply_health(self, devices: Mapping[str, Health], full: bool) -> None:
        """Desired health from the solver; ``full`` replaces every earlier word."""
        self.desired = dict(devices) if full else {**self.desired, **devices}
        self.refresh()

    def refresh(self) -> None:
        self.board.update(self.compute())

    def compute(self) -> dict[str, Health]:
        raise NotImplementedError

    def _allocate(self, device_ids: list[str]) -> Annotations:
        raise NotImplementedError

    def _choose(self, candidates: list[str], request: PreferredRequest) -> list[str]:
        """Default preference: must-include first, then IDs in sorted order."""
        return [*request.must_include, *candidates[: request.size - len(request.must_include)]]

    def numa_of(self, device_id: str) -> int | None:
        """The device's NUMA node for the kubelet's TopologyInfo (None: no affinity known)."""
        return None

    def status(self) -> dict[str, Any]:
        healthy, unhealthy = self.board.counts()
        return {"kind": self.kind, "healthy": healthy, "unhealthy": unhealthy}


def check_preferred(resource: str, request: PreferredRequest) -> list[str]:
    """Validate a preferred request; return the candidates beyond must-include, sorted."""
    available = set(request.available)
    must = set(request.must_include)
    if len(available) != len(request.available) or len(must) != len(request.must_include):
        raise invalid(resource, "duplicate device IDs in GetPreferredAllocation")
    if not must <= available:
        raise invalid(resource, "must-include devices are not all available")
    if not len(must) <= request.size <= len(available) or request.size < 1:
        raise invalid(
            resource,
            f"allocation size {request.size} outside [{max(len(must), 1)}, {len(available)}]",
        )
    return sorted(available - must)
