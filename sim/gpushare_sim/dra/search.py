"""The search behind :func:`allocate`: requests in order, devices in slice order, backtracking.

See :mod:`.allocator` for the rules; this module only finds devices that satisfy them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpushare_common import dra

from .allocator import AllocationError, DeviceKey, Obj, Request, SliceDevice, Usage, read_request, taints_of
from .cel import evaluate

MAX_STEPS = 20_000
BLOCKING = ("NoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class Constraint:
    requests: frozenset[str]  # empty: every request
    attribute: str

    def covers(self, request: str) -> bool:
        return not self.requests or request.split("/", 1)[0] in self.requests


@dataclass
class _State:
    picks: list[tuple[str, SliceDevice, dict[str, int]]] = field(default_factory=list)
    values: dict[int, Any] = field(default_factory=dict)  # constraint index -> the shared value


def consumption(request: Request, device: SliceDevice) -> dict[str, int] | None:
    """What ``request`` takes from ``device`` (``{}``: the whole device); None: it cannot."""
    if any(name not in device.capacity for name in request.capacity):
        return None
    if not device.multiple:
        fits = all(amount <= device.capacity[n][0] for n, amount in request.capacity.items())
        return {} if fits else None
    taken: dict[str, int] = {}
    for name, (value, policy) in device.capacity.items():
        amount = dra.consumed(request.capacity.get(name), value, dict(policy) if policy else None)
        if amount is None:
            return None
        taken[name] = amount
    return taken


def _free(device: SliceDevice, taken: Mapping[str, int], used: Usage | None, state: _State) -> bool:
    mine = [c for _, d, c in state.picks if d.key == device.key]
    if not device.multiple:
        return (used is None or used.claims == 0) and not mine
    for name, amount in taken.items():
        total = (used.consumed.get(name, 0) if used else 0) + sum(c.get(name, 0) for c in mine) + amount
        if total > device.capacity[name][0]:
            return False
    return True


class Search:
    def __init__(self, devices: Sequence[SliceDevice], used: Mapping[DeviceKey, Usage],
                 rules: Iterable[Obj], constraints: Sequence[Constraint]) -> None:
        self.devices = devices
        self.used = used
        self.rules = list(rules)
        self.constraints = constraints
        self.steps = 0

    def eligible(self, request: Request, device: SliceDevice) -> dict[str, int] | None:
        view = device.view()
        if not all(evaluate(p, view) for p in request.selectors):
            return None
        blocking = [t for t in taints_of(device, self.rules) if t.get("effect") in BLOCKING]
        if any(not _tolerated(t, request.tolerations) for t in blocking):
            return None
        return consumption(request, device)

    def _in_use(self, device: SliceDevice, state: _State) -> bool:
        used = self.used.get(device.key)
        return (used is not None and used.claims > 0) or any(d.key == device.key for _, d, _ in state.picks)

    def _counters_free(self, device: SliceDevice, state: _State) -> bool:
        """Its counters allow it: drawn once, while it is allocated at all."""
        if not device.counters or self._in_use(device, state):
            return True
        for counter_set, counter, amount in device.counters:
            limit = device.limits.get(f"{counter_set}/{counter}")
            drawn = sum(a for other in self.devices
                        if other.pool == device.pool and other.driver == device.driver and self._in_use(other, state)
                        for s, c, a in other.counters if (s, c) == (counter_set, counter))
            if limit is None or drawn + amount > limit:
                return False
        return True

    def _constrained(self, name: str, device: SliceDevice, state: _State) -> dict[int, Any] | None:
        values = dict(state.values)
        for index, constraint in enumerate(self.constraints):
            if not constraint.covers(name):
                continue
            value = device.attributes.get(constraint.attribute)
            if value is None or values.setdefault(index, value) != value:
                return None
        return values

    def solve(self, requests: Sequence[Sequence[Request]], state: _State) -> _State | None:
        if not requests:
            return state
        for alternative in requests[0]:
            found = self._fill(alternative, alternative.count, 0, requests[1:], state)
            if found is not None:
                return found
        return None

    def _fill(self, request: Request, left: int, start: int, rest: Sequence[Sequence[Request]],
              state: _State) -> _State | None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise AllocationError(f"more than {MAX_STEPS} combinations tried; simplify the claim")
        if left == 0 and request.count:
            return self.solve(rest, state)
        for index in range(start, len(self.devices)):
            device = self.devices[index]
            taken = self.eligible(request, device)
            if taken is None or not _free(device, taken, self.used.get(device.key), state) \
                    or not self._counters_free(device, state):
                continue
            values = self._constrained(request.name, device, state)
            if values is None:
                continue
            after = _State([*state.picks, (request.name, device, taken)], values)
            found = self._fill(request, left - 1, index + 1, rest, after)
            if found is not None:
                return found
        if request.count == 0 and any(name == request.name for name, _, _ in state.picks):
            return self.solve(rest, state)  # All: every eligible device taken
        return None


def _tolerated(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") not in (None, "", taint.get("effect")):
            continue
        if toleration.get("key") not in (None, "", taint.get("key")):
            continue
        if toleration.get("operator", "Equal") == "Exists" or toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def requests_of(claim: Obj, classes: Mapping[str, Obj]) -> list[list[Request]]:
    """Per request of the claim, the alternatives to try (one, or its ``firstAvailable`` list)."""
    found: list[list[Request]] = []
    for index, request in enumerate(((claim.get("spec") or {}).get("devices") or {}).get("requests") or []):
        name, where = str(request.get("name", "")), f"spec.devices.requests[{index}]"
        if isinstance(request.get("exactly"), Mapping):
            found.append([read_request(name, request["exactly"], classes, f"{where}.exactly")])
        elif isinstance(request.get("firstAvailable"), list):
            found.append([read_request(f"{name}/{sub.get('name', '')}", sub, classes, f"{where}.firstAvailable[{i}]")
                          for i, sub in enumerate(request["firstAvailable"])])
        else:
            raise AllocationError(f"{where}: exactly or firstAvailable is required")
    if not found:
        raise AllocationError("spec.devices.requests: the claim requests no device")
    return found


def constraints_of(claim: Obj) -> list[Constraint]:
    found = []
    for index, raw in enumerate(((claim.get("spec") or {}).get("devices") or {}).get("constraints") or []):
        attribute = raw.get("matchAttribute") if isinstance(raw, Mapping) else None
        if not isinstance(attribute, str) or "/" not in attribute:
            raise AllocationError(f"spec.devices.constraints[{index}]: only matchAttribute with a "
                                  "qualified name (domain/name) is supported")
        found.append(Constraint(frozenset(raw.get("requests") or ()), attribute))
    return found


def allocate(claim: Obj, classes: Mapping[str, Obj], devices: Sequence[SliceDevice],
             used: Mapping[DeviceKey, Usage], rules: Iterable[Obj]) -> list[Obj]:
    """The allocation results for ``claim`` among ``devices`` (one node's); AllocationError
    when no combination satisfies it."""
    search = Search(devices, used, rules, constraints_of(claim))
    found = search.solve(requests_of(claim, classes), _State())
    if found is None:
        raise AllocationError("no devices satisfy the claim's requests, capacity, taints and constraints")
    results = []
    for request, device, taken in found.picks:
        result: Obj = {"request": request, "driver": device.driver, "pool": device.pool, "device": device.name}
        if device.multiple:
            result["consumedCapacity"] = {name: str(amount) for name, amount in taken.items()}
            result["shareID"] = str(uuid.uuid4())
        results.append(result)
    return results
