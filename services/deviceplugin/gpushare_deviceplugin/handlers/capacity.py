"""CPU/memory overselling: ``vcpu-<i>`` / ``vmem-<i>``, all Healthy.

See docs/architecture.md, 'Overselling CPU and memory'.
"""

from __future__ import annotations

from typing import Any

from ..devices import HEALTHY, Health
from .base import Annotations, PluginLogic


class CapacityLogic(PluginLogic):
    """``<domain>/vcpu`` or ``<domain>/vmem``: as many devices as the last SpareCapacity said."""

    kind = "capacity"

    def __init__(self, resource: str, token: str) -> None:
        super().__init__(resource)
        self.token = token
        self.count = 0
        self.unit = 0

    def set_capacity(self, count: int, unit: int) -> None:
        self.count = max(0, count)
        self.unit = unit
        self.refresh()

    def compute(self) -> dict[str, Health]:
        return {f"{self.token}-{i}": HEALTHY for i in range(self.count)}

    def _allocate(self, device_ids: list[str]) -> Annotations:
        return {}

    def status(self) -> dict[str, Any]:
        return {**super().status(), "unit": self.unit}
