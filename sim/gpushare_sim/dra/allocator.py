"""Structured parameters allocation, as the sim scheduler does it: claims from ResourceSlices.

Pure functions over the API's JSON objects. :func:`allocate` finds devices on one node for
every request of a claim:

- a request (``exactly``) names a DeviceClass; the class's selectors and the request's own
  (CEL, evaluated by :mod:`.cel`) must all hold; ``allocationMode`` ``ExactCount`` (``count``,
  default 1) or ``All``; ``firstAvailable`` subrequests are tried in order;
- a device without ``allowMultipleAllocations`` goes to one claim only; one with it may go to
  several, each consuming part of its consumable capacity (``capacity.requests``, rounded up by
  the capacity's ``requestPolicy``; unrequested, the policy's default or the whole capacity),
  never more than the capacity in total; the result records ``consumedCapacity`` and a
  ``shareID``;
- taints, from the slice and from DeviceTaintRules, keep a device away unless the request
  tolerates them (``NoSchedule`` and ``NoExecute``);
- counters (partitionable devices): a device draws ``consumesCounters`` from its pool's counter
  sets (``sharedCounters``, in any slice of the pool) while it is allocated, once however many
  allocations a multi-allocatable device has (as KEP-5075 has it); the draws of the allocated
  devices never exceed a counter;
- ``constraints[].matchAttribute``: every device of the named requests (all, when none are
  named) has the same value of the attribute;
- devices are tried in slice order (first fit: shares of one card fill it before the next).

Anything the sim does not support (admin access, other allocation modes, device configs it
would have to pass on) is an :class:`AllocationError` saying so, never a silent allocation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpushare_common import dra

from .cel import CelError, Device, Program, Value, Version, compile_selector, evaluate

Obj = dict[str, Any]
DeviceKey = tuple[str, str, str]  # driver, pool, device


class AllocationError(Exception):
    """Why a claim cannot be allocated (on a node, or anywhere)."""


@dataclass(frozen=True, slots=True)
class SliceDevice:
    driver: str
    pool: str
    node: str
    name: str
    attributes: Mapping[str, Value]
    capacity: Mapping[str, tuple[int, Mapping[str, Any] | None]]
    multiple: bool = False
    taints: tuple[Mapping[str, Any], ...] = ()
    counters: tuple[tuple[str, str, int], ...] = ()  # (counter set, counter, amount) it draws on
    limits: Mapping[str, int] = field(default_factory=dict)  # "<set>/<counter>" -> its pool's value

    @property
    def key(self) -> DeviceKey:
        return self.driver, self.pool, self.name

    def view(self) -> Device:
        return Device(self.driver, self.attributes, self.multiple,
                      {f"{self.driver}/{name}": amount for name, (amount, _) in self.capacity.items()})


@dataclass
class Usage:
    """What allocations already take from a device."""

    claims: int = 0
    consumed: dict[str, int] = field(default_factory=dict)


# --- reading the API objects ------------------------------------------------------------


def _attribute(value: Any) -> Value | None:
    if isinstance(value, Mapping):
        if isinstance(value.get("version"), str):
            return Version(value["version"])
        for kind in ("string", "int", "bool"):
            if kind in value:
                return value[kind]  # type: ignore[no-any-return]
    return None


def _counters(raw: Mapping[str, Any]) -> tuple[tuple[str, str, int], ...]:
    found = []
    for entry in raw.get("consumesCounters") or []:
        if isinstance(entry, Mapping):
            for name, value in (entry.get("counters") or {}).items():
                amount = value.get("value", 0) if isinstance(value, Mapping) else 0
                found.append((str(entry.get("counterSet", "")), str(name), dra.parse_count(amount, f"counter {name}")))
    return tuple(found)


def _limits(spec: Mapping[str, Any]) -> dict[str, int]:
    """A slice's counter sets: ``"<set>/<counter>"`` -> value (KEP-4815)."""
    found = {}
    for counter_set in spec.get("sharedCounters") or []:
        if isinstance(counter_set, Mapping):
            for name, value in (counter_set.get("counters") or {}).items():
                amount = value.get("value", 0) if isinstance(value, Mapping) else 0
                found[f"{counter_set.get('name', '')}/{name}"] = dra.parse_count(amount, f"counter {name}")
    return found


def _device(spec: Mapping[str, Any], raw: Mapping[str, Any], limits: Mapping[str, int] | None = None) -> SliceDevice:
    driver = str(spec.get("driver", ""))
    attributes = {}
    for name, value in (raw.get("attributes") or {}).items():
        found = _attribute(value)
        if found is not None:
            attributes[name if "/" in name else f"{driver}/{name}"] = found
    capacity = {}
    for name, value in (raw.get("capacity") or {}).items():
        if isinstance(value, Mapping):
            capacity[name.rsplit("/", 1)[-1]] = (dra.parse_count(value.get("value", 0), f"capacity {name}"),
                                                 value.get("requestPolicy"))
    return SliceDevice(driver, str((spec.get("pool") or {}).get("name", "")), str(spec.get("nodeName", "")),
                       str(raw.get("name", "")), attributes, capacity, bool(raw.get("allowMultipleAllocations")),
                       tuple(t for t in raw.get("taints") or [] if isinstance(t, Mapping)), _counters(raw),
                       limits or {})


def read_slices(slices: Iterable[Obj]) -> list[SliceDevice]:
    """Every device of the newest generation of each pool, in slice order (node-local slices)."""
    newest: dict[tuple[str, str], int] = {}
    for item in slices:
        spec = item.get("spec") or {}
        pool = spec.get("pool") or {}
        key = (str(spec.get("driver", "")), str(pool.get("name", "")))
        newest[key] = max(newest.get(key, 0), int(pool.get("generation", 0) or 0))
    current = [s for s in sorted(slices, key=lambda s: str(s["metadata"].get("name", "")))
               if int(((s.get("spec") or {}).get("pool") or {}).get("generation", 0) or 0)
               == newest[(str((s.get("spec") or {}).get("driver", "")),
                          str(((s.get("spec") or {}).get("pool") or {}).get("name", "")))]]
    limits: dict[tuple[str, str], dict[str, int]] = {}  # the counter sets of each pool, from any of its slices
    for item in current:
        spec = item.get("spec") or {}
        limits.setdefault((str(spec.get("driver", "")), str((spec.get("pool") or {}).get("name", ""))),
                          {}).update(_limits(spec))
    devices = []
    for item in current:
        spec = item.get("spec") or {}
        key = (str(spec.get("driver", "")), str((spec.get("pool") or {}).get("name", "")))
        if spec.get("nodeName"):
            devices += [_device(spec, raw, limits.get(key)) for raw in spec.get("devices") or []
                        if isinstance(raw, Mapping)]
    return devices


def usage(claims: Iterable[Obj], skip_uid: str = "") -> dict[DeviceKey, Usage]:
    """What every allocated claim (but ``skip_uid``) takes from each device."""
    used: dict[DeviceKey, Usage] = {}
    for claim in claims:
        if claim["metadata"].get("uid") == skip_uid:
            continue
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            item = used.setdefault((result.get("driver"), result.get("pool"), result.get("device")), Usage())
            item.claims += 1
            for name, amount in (result.get("consumedCapacity") or {}).items():
                item.consumed[name] = item.consumed.get(name, 0) + dra.parse_count(amount, "consumedCapacity")
    return used


def _matches_rule(selector: Mapping[str, Any], device: SliceDevice) -> bool:
    wanted = {"driver": device.driver, "pool": device.pool, "device": device.name}
    if any(selector.get(k) not in (None, "", v) for k, v in wanted.items()):
        return False
    programs = [compile_selector(s["cel"]["expression"]) for s in selector.get("selectors") or []]
    return all(evaluate(p, device.view()) for p in programs)


def taints_of(device: SliceDevice, rules: Iterable[Obj]) -> list[Mapping[str, Any]]:
    """The slice's own taints and those of every DeviceTaintRule that selects the device."""
    found = list(device.taints)
    for rule in rules:
        spec = rule.get("spec") or {}
        if _matches_rule(spec.get("deviceSelector") or {}, device) and isinstance(spec.get("taint"), Mapping):
            found.append(spec["taint"])
    return found


@dataclass(frozen=True, slots=True)
class Request:
    name: str
    selectors: tuple[Program, ...]
    count: int  # 0: All
    capacity: Mapping[str, int]
    tolerations: tuple[Mapping[str, Any], ...]


def _programs(where: str, selectors: Any) -> tuple[Program, ...]:
    programs = []
    for index, selector in enumerate(selectors or []):
        expression = (selector.get("cel") or {}).get("expression") if isinstance(selector, Mapping) else None
        if not isinstance(expression, str):
            raise AllocationError(f"{where}.selectors[{index}]: only CEL selectors are supported")
        try:
            programs.append(compile_selector(expression))
        except CelError as err:
            raise AllocationError(f"{where}.selectors[{index}]: {err}") from None
    return tuple(programs)


def read_request(name: str, body: Mapping[str, Any], classes: Mapping[str, Obj], where: str) -> Request:
    class_name = body.get("deviceClassName")
    device_class = classes.get(str(class_name))
    if device_class is None:
        raise AllocationError(f"{where}: DeviceClass {class_name!r} not found")
    if body.get("adminAccess"):
        raise AllocationError(f"{where}: adminAccess is not supported by this scheduler")
    mode = body.get("allocationMode", "ExactCount")
    if mode not in ("ExactCount", "All"):
        raise AllocationError(f"{where}.allocationMode: {mode!r} (ExactCount or All)")
    requests = ((body.get("capacity") or {}).get("requests") or {})
    try:
        capacity = {k.rsplit("/", 1)[-1]: dra.parse_count(v, f"{where}.capacity") for k, v in requests.items()}
    except dra.DraNameError as err:
        raise AllocationError(f"{where}.capacity.requests: {err}") from None
    selectors = _programs(f"DeviceClass {class_name}", (device_class.get("spec") or {}).get("selectors"))
    return Request(name, selectors + _programs(where, body.get("selectors")),
                   int(body.get("count", 1) or 1) if mode == "ExactCount" else 0, capacity,
                   tuple(body.get("tolerations") or []))
