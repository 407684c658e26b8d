"""The device list a plugin reports, and the wake-up its ListAndWatch streams wait on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Literal

Health = Literal["Healthy", "Unhealthy"]
HEALTHY: Health = "Healthy"
UNHEALTHY: Health = "Unhealthy"


class DeviceBoard:
    """Current ``{device id: health}`` with a version bumped on every real change."""

    def __init__(self) -> None:
        self._devices: dict[str, Health] = {}
        self.version = 0
        self._changed = asyncio.Event()

    def update(self, devices: Mapping[str, Health]) -> bool:
        """Replace the list; wake every watcher when it differs. Returns whether it did."""
        if devices == self._devices:
            return False
        self._devices = dict(devices)
        self.version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return True

    def devices(self) -> dict[str, Health]:
        return dict(self._devices)

    def counts(self) -> tuple[int, int]:
        healthy = sum(1 for h in self._devices.values() if h == HEALTHY)
        return healthy, len(self._devices) - healthy

    def health(self, device_id: str) -> Health | None:
        return self._devices.get(device_id)

    async def wait_newer(self, version: int, within_s: float) -> bool:
        """Wait until the version differs from ``version``; False on timeout."""
        if self.version != version:
            return True
        changed = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), within_s)
            return True
        return False
