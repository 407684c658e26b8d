"""CPU/memory overselling: the node's spare capacity, Koordinator-style.

See docs/architecture.md, 'Overselling CPU and memory'.

    spare = total − safety margin − max(system used, reserved) − Σ usage of ordinary pods

``system used`` is the node's usage not accounted to any pod; *ordinary*
pods are every pod except the batch pods that consume the oversold resource
(they must not shrink what they are sold).  Spare capacity is advertised as
devices: one ``vcpu`` device = 100 millicores, one ``vmem`` device = 256 MiB.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

VCPU_UNIT_MILLICORES = 100
VMEM_UNIT_BYTES = 256 << 20
UNITS = {"vcpu": VCPU_UNIT_MILLICORES, "vmem": VMEM_UNIT_BYTES}
# (used, total) of each side of the node, as published in the events' inputs
NODE_USAGE = (("node_cpu_used_m", "node_cpu_total_m"), ("node_memory_used", "node_memory_total"))


@dataclass(frozen=True, slots=True)
class Policy:
    margin_ratio: float = 0.10
    reserved_millicores: float = 0.0
    reserved_memory_bytes: float = 0.0
    change_ratio: float = 0.10
    republish_s: float = 300.0
    stale_s: float = 900.0
    usage_step: float = 0.05  # also publish when the node's use moved by this share of its total


@dataclass(frozen=True, slots=True)
class Inputs:
    """One resource's inputs, in millicores (vcpu) or bytes (vmem)."""

    total: float
    node_used: float
    pods_used: float  # all pods, batch included
    ordinary_used: float  # the pods that count against spare capacity
    reserved: float

    @property
    def system_used(self) -> float:
        return max(0.0, self.node_used - self.pods_used)


@dataclass(frozen=True, slots=True)
class Spare:
    resource: str
    amount: float  # millicores or bytes
    devices: int
    unit: int
    inputs: dict[str, float]


def spare(resource: str, inputs: Inputs, margin_ratio: float) -> Spare:
    margin = inputs.total * margin_ratio
    amount = max(0.0, inputs.total - margin - max(inputs.system_used, inputs.reserved) - inputs.ordinary_used)
    unit = UNITS[resource]
    details = {
        "total": inputs.total, "node_used": inputs.node_used, "pods_used": inputs.pods_used,
        "ordinary_used": inputs.ordinary_used, "system_used": inputs.system_used,
        "reserved": inputs.reserved, "margin": margin, "spare": amount,
    }
    return Spare(resource, amount, math.floor(amount / unit), unit, details)


def zero(resource: str, reason_age_s: float) -> Spare:
    """What to advertise when the statistics are stale: nothing."""
    return Spare(resource, 0.0, 0, UNITS[resource], {"stale_for_s": reason_age_s})


def should_publish(previous: int | None, current: int, since_last_s: float, policy: Policy) -> bool:
    """Publish on the first value, a change above ``change_ratio``, or every ``republish_s``."""
    if previous is None or since_last_s >= policy.republish_s:
        return True
    if previous == 0:
        return current != 0
    return abs(current - previous) > policy.change_ratio * previous


def usage_moved(before: Mapping[str, float], after: Mapping[str, float], step: float) -> bool:
    """True when the node's CPU or memory use moved by more than ``step`` of its total.

    The solver judges pressure on these figures; they move without changing the
    spare capacity when the batch pods themselves grow, so they need their own
    trigger.
    """
    for used, total in NODE_USAGE:
        size = after.get(total, 0.0)
        if size > 0 and abs(after.get(used, 0.0) - before.get(used, 0.0)) > step * size:
            return True
    return False
