"""The node's /proc: pid namespace of a pid, and containers found by their cgroup paths.

``CgroupSource`` reads ``/proc/<pid>/cgroup`` of every process and matches
each line's path with a regular expression whose named groups give the
container's identity: ``container_id`` (required), and when the layout
carries them ``namespace``, ``pod`` and ``container``. The default pattern
matches the kubelet's layouts (cgroupfs and systemd drivers, containerd or
CRI-O): ``.../kubepods.../pod<uid>/<64-hex id>`` and ``cri-containerd-<id>.scope``;
those carry no pod name, which the containerd source supplies for the same
container id.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

from ..resolver import ContainerProcs

KUBELET_PATTERN = (
    r"kubepods.*?pod[0-9a-fA-F_-]{36}(?:\.slice)?/"
    r"(?:cri-containerd-|crio-|docker-)?(?P<container_id>[0-9a-f]{64})(?:\.scope)?$"
)


def pidns_of(pid: int | str, proc: str = "/proc") -> int | None:
    """Inode of ``/proc/<pid>/ns/pid`` (the pid namespace id the kernel reports), None when gone."""
    try:
        return os.stat(f"{proc}/{pid}/ns/pid").st_ino
    except OSError:
        return None


def cgroup_of(pid: int, proc: str = "/proc") -> str | None:
    """The whole ``/proc/<pid>/cgroup`` text (its cgroup membership), None when the pid is gone."""
    try:
        with open(f"{proc}/{pid}/cgroup", encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def host_pidns(proc: str = "/proc") -> int | None:
    return pidns_of("self", proc)


def match_cgroup(text: str, pattern: re.Pattern[str]) -> dict[str, str] | None:
    """The named groups of the first ``/proc/<pid>/cgroup`` line whose path matches."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        found = pattern.search(path)
        if found and found.groupdict().get("container_id"):
            return {k: v for k, v in found.groupdict().items() if v}
    return None


def scan(proc: str, pattern: re.Pattern[str]) -> list[ContainerProcs]:
    groups: dict[str, tuple[dict[str, str], list[int]]] = {}
    for entry in Path(proc).iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "cgroup").read_text()
        except OSError:
            continue
        found = match_cgroup(text, pattern)
        if found is not None:
            groups.setdefault(found["container_id"], (found, []))[1].append(int(entry.name))
    return [_procs(cid, found, pids) for cid, (found, pids) in groups.items()]


def _procs(container_id: str, found: dict[str, str], pids: list[int]) -> ContainerProcs:
    pod = f"{found['namespace']}/{found['pod']}" if "namespace" in found and "pod" in found else ""
    return ContainerProcs(container_id, tuple(sorted(pids)), pod, found.get("container", ""))


class CgroupSource:
    name = "cgroup"

    def __init__(self, pattern: str = KUBELET_PATTERN, proc: str = "/proc") -> None:
        self.pattern = re.compile(pattern)
        if "container_id" not in self.pattern.groupindex:
            raise ValueError(f"cgroup pattern {pattern!r} has no (?P<container_id>...) group")
        self.proc = proc

    async def containers(self) -> list[ContainerProcs]:
        return await asyncio.to_thread(scan, self.proc, self.pattern)
