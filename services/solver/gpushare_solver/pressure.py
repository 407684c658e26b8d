"""Pressure eviction of oversold pods, as pure functions.

See docs/architecture.md, 'Overselling CPU and memory'.

When the node's memory use passes its threshold (default 70%) or its CPU use
passes its own, pods that requested ``gpushare/vcpu`` or ``gpushare/vmem`` are
evicted, lowest priority first and then newest first, until the estimated
use is back under every threshold. After an eviction round nothing more is
evicted for a cooldown, so the next figures reflect what was freed.

Inputs are the ``inputs`` of the detector's SpareCapacity events
(``node_cpu_used_m``, ``node_cpu_total_m``, ``node_memory_used``,
``node_memory_total``) and the pods bound to the node, as :func:`gpushare_common.pods.read_pod`
reads them (``Pod.vcpu``, ``Pod.vmem``: the devices its containers request).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from gpushare_common.pods import Pod

PRESSURE = "pressure"


class PressureInputError(ValueError):
    def __init__(self, where: str, value: object, expected: str) -> None:
        self.where, self.value, self.expected = where, value, expected
        super().__init__(f"{where}={value!r}: expected {expected}")


@dataclass(frozen=True, slots=True)
class PressurePolicy:
    memory_threshold: float = 0.70
    cpu_threshold: float = 0.90
    cooldown_s: float = 30.0


@dataclass(frozen=True, slots=True)
class NodeUsage:
    cpu_used_m: float
    cpu_total_m: float
    memory_used: float
    memory_total: float

    @classmethod
    def from_inputs(cls, inputs: Mapping[str, float]) -> NodeUsage:
        def read(key: str) -> float:
            value = inputs.get(key)
            if not isinstance(value, int | float) or value != value or value < 0:
                raise PressureInputError(f"capacity inputs[{key}]", value, "a number >= 0")
            return float(value)

        return cls(read("node_cpu_used_m"), read("node_cpu_total_m"),
                   read("node_memory_used"), read("node_memory_total"))

    def over(self, policy: PressurePolicy, freed_cpu_m: float = 0.0, freed_memory: float = 0.0) -> set[str]:
        """The resources still above their threshold once ``freed_*`` is subtracted."""
        found = set()
        if self.cpu_total_m > 0 and (self.cpu_used_m - freed_cpu_m) > policy.cpu_threshold * self.cpu_total_m:
            found.add("cpu")
        if self.memory_total > 0 and \
                (self.memory_used - freed_memory) > policy.memory_threshold * self.memory_total:
            found.add("memory")
        return found


@dataclass(frozen=True, slots=True)
class OversoldPod:
    key: str
    priority: int
    created: float  # epoch seconds
    vcpu: int  # devices of gpushare/vcpu requested
    vmem: int  # devices of gpushare/vmem requested
    uid: str = ""


def _created(stamp: str) -> float:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def oversold_pod(pod: Pod) -> OversoldPod | None:
    """The pod's oversold requests, or None when it requests neither vcpu nor vmem."""
    if not pod.vcpu and not pod.vmem:
        return None
    return OversoldPod(key=pod.key, priority=pod.priority, created=_created(pod.created), vcpu=pod.vcpu,
                       vmem=pod.vmem, uid=pod.uid)


def eviction_order(pods: list[OversoldPod]) -> list[OversoldPod]:
    """Lowest priority first; among equals the newest first; then by key for a stable order."""
    return sorted(pods, key=lambda p: (p.priority, -p.created, p.key))


def choose_victims(usage: NodeUsage, pods: list[OversoldPod], policy: PressurePolicy,
                   units: Mapping[str, float], last_eviction: float | None, now: float) -> list[str]:
    """Pods to evict now (possibly none). ``units``: millicores per vcpu device, bytes per vmem device."""
    over = usage.over(policy)
    if not over or (last_eviction is not None and now - last_eviction < policy.cooldown_s):
        return []
    freed_cpu = freed_memory = 0.0
    victims: list[str] = []
    for pod in eviction_order(pods):
        helps = ("cpu" in over and pod.vcpu > 0) or ("memory" in over and pod.vmem > 0)
        if not helps:
            continue
        victims.append(pod.key)
        freed_cpu += pod.vcpu * units.get("vcpu", 0.0)
        freed_memory += pod.vmem * units.get("vmem", 0.0)
        over = usage.over(policy, freed_cpu, freed_memory)
        if not over:
            break
    return victims
