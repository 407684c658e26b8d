"""Read the node's cgroup and /proc statistics (cgroup v1 and v2, systemd or cgroupfs layout)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..cgroupstats import NodeStats, StatsError, Usage, node_stats, pod_uid, usage_v1, usage_v2

MAX_DEPTH = 4
V1_CPU = ("cpuacct", "cpu,cpuacct", "cpuacct,cpu")


@dataclass(slots=True)
class PodsUsage:
    version: int
    pods: dict[str, Usage] = field(default_factory=dict)  # by pod uid
    errors: dict[str, str] = field(default_factory=dict)  # uid -> reason


def version_of(root: Path) -> int:
    return 2 if (root / "cgroup.controllers").exists() else 1


def _pod_dirs(base: Path) -> dict[str, Path]:
    """Pod uid -> its cgroup directory, searching ``kubepods*`` below ``base``."""
    found: dict[str, Path] = {}
    stack = [(base / name, 1) for name in _children(base) if name.startswith("kubepods")]
    while stack:
        directory, depth = stack.pop()
        uid = pod_uid(directory.name)
        if uid is not None:
            found[uid] = directory
            continue
        if depth < MAX_DEPTH:
            stack.extend((directory / name, depth + 1) for name in _children(directory))
    return found


def _children(directory: Path) -> list[str]:
    try:
        return [e.name for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _read(path: Path) -> str:
    return path.read_text(encoding="ascii", errors="replace")


def _usage_v2(directory: Path) -> Usage:
    return usage_v2(_read(directory / "cpu.stat"), _read(directory / "memory.current"),
                    _read(directory / "memory.stat"))


def _usage_v1(cpu: Path, memory: Path) -> Usage:
    return usage_v1(_read(cpu / "cpuacct.usage"), _read(memory / "memory.usage_in_bytes"),
                    _read(memory / "memory.stat"))


def _pod_pairs(root: Path, version: int) -> dict[str, tuple[Path, Path]]:
    """Pod uid -> (cpu directory, memory directory); the same one twice on v2."""
    if version == 2:
        return {uid: (d, d) for uid, d in _pod_dirs(root).items()}
    cpu_root = next((root / n for n in V1_CPU if (root / n).is_dir()), root / "cpuacct")
    cpu_dirs, memory_dirs = _pod_dirs(cpu_root), _pod_dirs(root / "memory")
    return {uid: (c, memory_dirs[uid]) for uid, c in cpu_dirs.items() if uid in memory_dirs}


def read_pods(root: Path) -> PodsUsage:
    version = version_of(root)
    result = PodsUsage(version)
    for uid, (cpu, memory) in _pod_pairs(root, version).items():
        try:
            result.pods[uid] = _usage_v2(cpu) if version == 2 else _usage_v1(cpu, memory)
        except (OSError, StatsError) as err:  # a pod that just ended, or a garbled file
            result.errors[uid] = str(err)
    return result


def read_node(proc_root: Path) -> NodeStats:
    try:
        return node_stats(_read(proc_root / "stat"), _read(proc_root / "meminfo"))
    except OSError as err:
        raise StatsError(str(proc_root), f"cannot read: {err}") from None
