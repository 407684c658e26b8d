"""Plain data the detector passes between its parts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

# resource name -> device ids, for one container
ContainerDevices: TypeAlias = dict[str, tuple[str, ...]]
# "<namespace>/<pod>" -> container name -> resource -> device ids (from pod-resources)
NodeDevices: TypeAlias = dict[str, dict[str, ContainerDevices]]
# (event kind, pod key, container, resource): one published fact
FactKey: TypeAlias = tuple[str, str, str, str]
# the same, read-only (what callers may pass in)
DevicesOf: TypeAlias = Mapping[str, Mapping[str, tuple[str, ...]]]
NodeDevicesIn: TypeAlias = Mapping[str, DevicesOf]
