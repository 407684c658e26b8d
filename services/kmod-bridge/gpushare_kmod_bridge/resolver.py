"""Pid namespace <-> container resolution for this node's containers.

A *source* lists containers with the host pids of (some of) their
processes: :class:`~.adapters.procfs.CgroupSource` reads every process's
cgroup path, :class:`~.adapters.containerd.ContainerdSource` asks containerd
for its tasks (one pid each) and their CRI identity. Entries of several
sources that name the same container id are merged: identity from whichever
knows it, pids from all. Each pid gives its pid namespace (the inode of
``/proc/<pid>/ns/pid``); the host's own namespace is never a container's.

The map is rebuilt every ``refresh_s`` (containers that start or stop show
up there) and at once when a notice or a command names something the map
does not know (a container started since), at most every ``min_refresh_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpushare_common.logging import get_logger
from gpushare_common.retry import wait_for_stop

log = get_logger("kmod-bridge.resolver")


@dataclass(frozen=True, slots=True)
class ContainerProcs:
    """A container as one source sees it; ``pod`` is ``<ns>/<name>`` ("" when unknown)."""

    container_id: str
    pids: tuple[int, ...]
    pod: str = ""
    container: str = ""


@dataclass(frozen=True, slots=True)
class Owner:
    pod: str
    container: str
    container_id: str = ""


class ContainerSource(Protocol):
    name: str

    async def containers(self) -> list[ContainerProcs]: ...


class ResolveError(ValueError):
    """A pod key that is not ``<ns>/<pod>`` or ``<ns>/<pod>/<container>``."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"invalid pod key {key!r}: expected <namespace>/<pod>[/<container>]")


def split_key(key: str) -> tuple[str, str]:
    """``ns/pod`` -> (``ns/pod``, ""); ``ns/pod/c`` -> (``ns/pod``, ``c``)."""
    parts = key.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise ResolveError(key)
    return "/".join(parts[:2]), (parts[2] if len(parts) == 3 else "")


def merge(found: Iterable[ContainerProcs]) -> list[ContainerProcs]:
    merged: dict[str, ContainerProcs] = {}
    for item in found:
        old = merged.get(item.container_id)
        if old is None:
            merged[item.container_id] = item
            continue
        merged[item.container_id] = ContainerProcs(
            item.container_id, tuple(sorted({*old.pids, *item.pids})),
            old.pod or item.pod, old.container or item.container)
    return list(merged.values())


@dataclass
class Snapshot:
    owners: dict[int, Owner] = field(default_factory=dict)  # pidns -> owner
    taken: float = 0.0
    complete: bool = False  # every source answered: what is missing here is gone
    pids: dict[str, tuple[int, ...]] = field(default_factory=dict)  # container id -> host pids seen

    @property
    def container_ids(self) -> set[str]:
        return {o.container_id for o in self.owners.values() if o.container_id}

    def pidns_of(self, pod: str, container: str = "") -> list[int]:
        return sorted(p for p, o in self.owners.items()
                      if o.pod == pod and (not container or o.container == container))


class Resolver:
    def __init__(self, sources: Sequence[ContainerSource], pidns_of: Callable[[int], int | None],
                 host_pidns: int | None, min_refresh_s: float = 0.2,
                 cgroup_of: Callable[[int], str | None] = lambda pid: None) -> None:  # fmt: skip
        self.sources = sources
        self.pidns_of = pidns_of
        self.cgroup_of = cgroup_of
        self.host_pidns = host_pidns
        self.min_refresh_s = min_refresh_s
        self.snapshot = Snapshot()
        self.on_refresh: list[Callable[[Snapshot], Awaitable[None]]] = []
        self._lock = asyncio.Lock()

    async def refresh(self, force: bool = True) -> Snapshot:
        async with self._lock:
            if not force and time.monotonic() - self.snapshot.taken < self.min_refresh_s:
                return self.snapshot
            found: list[ContainerProcs] = []
            complete = True
            for source in self.sources:
                try:
                    found += await source.containers()
                except Exception as err:  # one broken source must not hide the others
                    complete = False
                    log.warning("container source failed", source=source.name, error=repr(err))
            merged = merge(found)
            self.snapshot = Snapshot(self._owners(merged), time.monotonic(), complete,
                                     {c.container_id: c.pids for c in merged})
        for listener in self.on_refresh:
            await listener(self.snapshot)
        return self.snapshot

    def _owners(self, containers: list[ContainerProcs]) -> dict[int, Owner]:
        owners: dict[int, Owner] = {}
        for item in containers:
            for pid in item.pids:
                pidns = self.pidns_of(pid)
                if pidns is None or pidns == self.host_pidns:
                    continue
                known = owners.get(pidns)
                if known is None or (not known.pod and item.pod):
                    owners[pidns] = Owner(item.pod, item.container, item.container_id)
        return owners

    def same_container(self, container_id: str, pid: int, pidns: int) -> bool | None:
        """Whether ``pid`` (a host pid in ``pidns``) runs in container ``container_id``, judged by
        cgroup membership against a live pid of that container seen at the last listing. None
        when it cannot be told: ``pid`` is not (or no longer) a process of ``pidns``, no pid of
        the container is known or alive, or a cgroup cannot be read. Only a positive difference
        says False, since a False wakes the caller without an owner-back. Two or three small
        file reads, so it can run on the owner-back path."""
        if self.pidns_of(pid) != pidns:
            return None
        theirs = next((c for c in map(self.cgroup_of, self.snapshot.pids.get(container_id, ())) if c is not None),
                      None)  # fmt: skip
        mine = self.cgroup_of(pid)
        if theirs is None or mine is None:
            return None
        return mine == theirs

    async def owner(self, pidns: int) -> Owner | None:
        """The container of ``pidns``, refreshing once (rate-limited) when unknown."""
        owner = self.snapshot.owners.get(pidns)
        if owner is None:
            owner = (await self.refresh(force=False)).owners.get(pidns)
        return owner

    async def namespaces(self, keys: Sequence[str]) -> dict[str, list[int]]:
        """Pod or pod/container keys -> their pid namespaces (refreshed first)."""
        wanted = [(key, *split_key(key)) for key in keys]
        if not wanted:
            return {}
        snapshot = await self.refresh(force=False)
        if any(not snapshot.pidns_of(pod, c) for _, pod, c in wanted):
            snapshot = await self.refresh(force=True)
        return {key: snapshot.pidns_of(pod, c) for key, pod, c in wanted}

    async def run(self, stop: asyncio.Event, refresh_s: float) -> None:
        while not stop.is_set():
            await self.refresh()
            await wait_for_stop(stop, refresh_s)
