"""The watch set: which pid namespaces the kernel should watch or detect, and whose they are.

The kernel forgets everything when the module is reloaded and the bridge
forgets when it restarts, so the set is kept here and in a NATS key-value
bucket (one key per pid namespace), and re-sent after every registration:
ADD for ``watched`` entries, DETECT for ``detected`` ones. A notice clears
need_notice in the kernel, so it turns the entry back to ``watched`` here too.

The set in memory is the truth the kernel is told; the bucket is its copy for the next start.
A write the bucket refuses or does not answer (NATS restarting, a stream without a leader)
never fails the caller — a notice, a command, a registration: the key is marked unsaved and
written again by :meth:`WatchSet.flush` (the service runs it every second) until it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, Protocol, TypeVar

import msgspec
from gpushare_common.bus import BusError
from gpushare_common.events import OWNER, Placement, counted_only
from gpushare_common.logging import get_logger

T = TypeVar("T")
log = get_logger("kmod-bridge.watchset")
Mode = Literal["watched", "detected"]
Owned = tuple[str, str, str]  # pod key, container name, container id


class WatchEntry(msgspec.Struct, frozen=True, kw_only=True):
    pidns: int
    mode: Mode = "watched"
    pod: str = ""
    container: str = ""
    container_id: str = ""  # the runtime's id of the container the namespace was found in
    role: str = ""  # where the detector placed its container: owner, sharer, borrower ("": not said)
    cards: tuple[str, ...] = ()
    shadow: str = ""  # a sharer's ShadowPod

    @property
    def count_only(self) -> bool:
        """A sharer's or a borrower's: counted, never detected or held."""
        return counted_only(self.role)


class KeyValue(Protocol):
    async def get(self, key: str, kind: type[T]) -> T | None: ...
    async def put(self, key: str, value: Any) -> int: ...
    async def delete(self, key: str) -> None: ...
    async def items(self, kind: type[T]) -> dict[str, T]: ...


class WatchSet:
    def __init__(self, store: KeyValue | None = None) -> None:
        self.store = store
        self.entries: dict[int, WatchEntry] = {}
        self.unsaved: set[int] = set()  # keys whose bucket copy lags the set in memory

    async def load(self, store: KeyValue | None = None) -> int:
        """Read the set back from ``store`` (then kept there). What changed in memory since the
        start (the kernel link may run before the bucket can be read) wins over the bucket's copy,
        and is written back."""
        self.store = store or self.store
        if self.store is not None:
            saved = await self.store.items(WatchEntry)
            changed = self.entries
            self.entries = {**{entry.pidns: entry for entry in saved.values()}, **changed}
            for pidns in changed:
                await self._save(pidns)
        return len(self.entries)

    def by_mode(self, mode: Mode) -> list[int]:
        return sorted(p for p, e in self.entries.items() if e.mode == mode)

    def get(self, pidns: int) -> WatchEntry | None:
        return self.entries.get(pidns)

    async def put(self, entry: WatchEntry) -> None:
        if self.entries.get(entry.pidns) == entry:
            return
        self.entries[entry.pidns] = entry
        await self._save(entry.pidns)

    async def _save(self, pidns: int) -> None:
        """The bucket's copy of one key (its entry, or its absence); on failure it stays unsaved."""
        if self.store is None:
            return
        entry = self.entries.get(pidns)
        try:
            if entry is None:
                await self.store.delete(str(pidns))
            else:
                await self.store.put(str(pidns), entry)
        except BusError as err:
            if not self.unsaved:
                log.warning("watch set not saved; kept in memory and saved again", pidns=pidns, error=str(err))
            self.unsaved.add(pidns)
        else:
            self.unsaved.discard(pidns)

    async def flush(self) -> int:
        """Write every unsaved key again; how many still lag."""
        for pidns in sorted(self.unsaved):
            await self._save(pidns)
        return len(self.unsaved)

    async def set_mode(self, ids: Iterable[int], mode: Mode, owners: dict[int, Owned]) -> None:
        """Add or update entries; the owner of an earlier entry stays when none is given."""
        for pidns in ids:
            old = self.entries.get(pidns) or WatchEntry(pidns=pidns)
            pod, container, cid = owners.get(pidns) or (old.pod, old.container, old.container_id)
            await self.put(msgspec.structs.replace(old, mode=mode, pod=pod, container=container, container_id=cid))

    async def place(self, placed: Mapping[int, Placement]) -> None:
        """Record where the detector placed the containers of these entries. An owner's stays an
        owner's: a namespace shared by an owner's container and another (one pid namespace per
        pod) is never made counted-only, so it can still be detected."""
        for pidns, where in placed.items():
            old = self.entries.get(pidns)
            if old is None or (old.role == OWNER and where.role != OWNER):
                continue
            await self.put(msgspec.structs.replace(old, role=where.role, cards=where.cards, shadow=where.shadow))

    def of_pod(self, pod: str, container: str = "") -> list[int]:
        """The namespaces recorded for a pod (or one of its containers), live or gone."""
        return sorted(p for p, e in self.entries.items()
                      if e.pod == pod and (not container or e.container == container))  # fmt: skip

    async def undetect(self, ids: Iterable[int]) -> None:
        for pidns in ids:
            old = self.entries.get(pidns)
            if old is not None:
                await self.put(msgspec.structs.replace(old, mode="watched"))

    async def remove(self, ids: Iterable[int]) -> None:
        for pidns in ids:
            if self.entries.pop(pidns, None) is not None:
                await self._save(pidns)

    def counted_only(self, ids: Iterable[int]) -> list[WatchEntry]:
        """The entries of ``ids`` that are only counted (sharers', borrowers')."""
        return [e for p in ids if (e := self.entries.get(p)) is not None and e.count_only]

    def counts(self) -> dict[str, int]:
        return {"watched": len(self.by_mode("watched")), "detected": len(self.by_mode("detected"))}


class MemoryStore:
    """A :class:`KeyValue` in memory (tests and a bridge run without persistence)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    async def get(self, key: str, kind: type[T]) -> T | None:
        raw = self.data.get(key)
        return None if raw is None else msgspec.json.decode(raw, type=kind)

    async def put(self, key: str, value: Any) -> int:
        self.data[key] = msgspec.json.encode(value)
        return len(self.data)

    async def delete(self, key: str) -> None:
        self.data.pop(key, None)

    async def items(self, kind: type[T]) -> dict[str, T]:
        return {k: msgspec.json.decode(v, type=kind) for k, v in self.data.items()}
