"""Plain data the detector passes between its parts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

from gpushare_common.adapters.podresources import ContainerDevices as ContainerDevices
from gpushare_common.adapters.podresources import NodeDevices as NodeDevices

# (event kind, pod key, container, resource): one published fact
FactKey: TypeAlias = tuple[str, str, str, str]
# the same, read-only (what callers may pass in)
DevicesOf: TypeAlias = Mapping[str, Mapping[str, tuple[str, ...]]]
NodeDevicesIn: TypeAlias = Mapping[str, DevicesOf]
