"""Parse cgroup (v1 and v2) and /proc statistics: pure functions of file contents.

Memory usage is the working set (usage minus inactive file cache), as the
kubelet and Koordinator count it; CPU usage is a cumulative counter in
nanoseconds (a rate needs two samples).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

POD_DIR = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(\.slice)?\Z")
BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")
USER_HZ = 100


class StatsError(ValueError):
    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: {reason}")


@dataclass(frozen=True, slots=True)
class Usage:
    cpu_ns: int  # cumulative CPU time
    memory: int  # working set, bytes


def _int(source: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise StatsError(source, f"expected an integer, got {text.strip()[:40]!r}") from None
    if value < 0:
        raise StatsError(source, f"negative value {value}")
    return value


def flat_keyed(source: str, text: str) -> dict[str, int]:
    """``key value`` lines (cpu.stat, memory.stat)."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2:
            if parts:
                raise StatsError(source, f"expected 'key value', got {line[:60]!r}")
            continue
        found[parts[0]] = _int(source, parts[1])
    return found


def usage_v2(cpu_stat: str, memory_current: str, memory_stat: str) -> Usage:
    cpu = flat_keyed("cpu.stat", cpu_stat)
    if "usage_usec" not in cpu:
        raise StatsError("cpu.stat", "no usage_usec")
    current = _int("memory.current", memory_current)
    inactive = flat_keyed("memory.stat", memory_stat).get("inactive_file", 0)
    return Usage(cpu["usage_usec"] * 1000, max(0, current - inactive))


def usage_v1(cpuacct_usage: str, memory_usage: str, memory_stat: str) -> Usage:
    usage = _int("memory.usage_in_bytes", memory_usage)
    stat = flat_keyed("memory.stat", memory_stat)
    inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
    return Usage(_int("cpuacct.usage", cpuacct_usage), max(0, usage - inactive))


def pod_uid(directory_name: str) -> str | None:
    """``kubepods-burstable-pod1234_..._.slice`` or ``pod1234-...`` -> the pod uid."""
    match = POD_DIR.search(directory_name)
    return match.group(1).replace("_", "-") if match else None


@dataclass(frozen=True, slots=True)
class NodeStats:
    cpus: int
    cpu_busy_ns: int  # cumulative busy time of all CPUs
    memory_total: int
    memory_used: int  # total - available


def node_stats(proc_stat: str, meminfo: str) -> NodeStats:
    cpus, busy = 0, None
    for line in proc_stat.splitlines():
        name, _, rest = line.partition(" ")
        if name == "cpu":
            values = [_int("/proc/stat", v) for v in rest.split()]
            busy = sum(values[i] for i in (0, 1, 2, 5, 6, 7) if i < len(values))
        elif name.startswith("cpu") and name[3:].isdigit():
            cpus += 1
    if busy is None or cpus == 0:
        raise StatsError("/proc/stat", "no cpu lines")
    memory = {k: v * 1024 for k, v in _meminfo(meminfo).items()}
    if "MemTotal" not in memory or "MemAvailable" not in memory:
        raise StatsError("/proc/meminfo", "MemTotal and MemAvailable are required")
    used = max(0, memory["MemTotal"] - memory["MemAvailable"])
    return NodeStats(cpus, busy * (1_000_000_000 // USER_HZ), memory["MemTotal"], used)


def _meminfo(text: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            found[key.strip()] = _int("/proc/meminfo", parts[0])
    return found
