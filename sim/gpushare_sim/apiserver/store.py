"""In-memory object store: one resourceVersion counter, a bounded change history, watchers.

Everything here runs on the server's event loop thread; no method awaits, so
every operation is atomic with respect to the others.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from .errors import gone
from .kinds import Kind
from .selectors import FieldTerm, Requirement, labels_match

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped kinds

INDEXED_FIELD = "spec.nodeName"  # node agents each watch their own node's pods

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


@dataclass(slots=True)
class Entry:
    """A stored object and its encoded JSON (objects are never mutated once stored)."""

    obj: Obj
    raw: bytes

    def copy(self) -> Obj:
        result: Obj = _decode(self.raw)
        return result

    @property
    def rv(self) -> int:
        return int(self.obj["metadata"]["resourceVersion"])


@dataclass(slots=True)
class Change:
    rv: int
    kind: Kind
    type: str  # ADDED, MODIFIED, DELETED
    entry: Entry
    old: Entry | None
    lines: dict[str, bytes] = field(default_factory=dict)

    def line(self, event_type: str) -> bytes:
        cached = self.lines.get(event_type)
        if cached is None:
            source = self.entry
            if event_type == "DELETED" and self.type == "MODIFIED" and self.old is not None:
                obj = self.old.copy()  # left the selection: the last state that matched
                obj["metadata"]["resourceVersion"] = str(self.rv)
                source = Entry(obj, _encode(obj))
            cached = event_line(event_type, source.raw)
            self.lines[event_type] = cached
        return cached


def _node_of(obj: Obj) -> str:
    spec = obj.get("spec")
    return str(spec.get("nodeName") or "") if isinstance(spec, dict) else ""


def event_line(event_type: str, raw: bytes) -> bytes:
    return b'{"type":"' + event_type.encode() + b'","object":' + raw + b"}\n"


@dataclass(frozen=True, slots=True)
class Selection:
    """Which objects of a kind a list or watch asks for."""

    kind: Kind
    namespace: str | None = None
    labels: tuple[Requirement, ...] = ()
    fields: tuple[FieldTerm, ...] = ()

    def index_key(self) -> str | None:
        """The node this selection is limited to, if any (watchers are indexed by it)."""
        for term in self.fields:
            if term.field == INDEXED_FIELD and not term.negate:
                return term.value
        return None

    def matches(self, obj: Obj) -> bool:
        meta = obj["metadata"]
        if self.namespace is not None and meta.get("namespace", "") != self.namespace:
            return False
        if self.labels and not labels_match(self.labels, meta.get("labels") or {}):
            return False
        field_value = self.kind.field_value
        return all((field_value(obj, term.field) == term.value) != term.negate for term in self.fields)


class Watcher:
    """One open watch: a bounded queue of encoded event lines."""

    def __init__(self, selection: Selection, capacity: int) -> None:
        self.selection = selection
        self.capacity = capacity
        self.lines: deque[bytes] = deque()
        self.wake = asyncio.Event()
        self.overflowed = False
        self.closed = False

    def offer(self, change: Change) -> None:
        if self.overflowed or self.closed:
            return
        event_type = self._event_type(change)
        if event_type is None:
            return
        if len(self.lines) >= self.capacity:
            self.overflowed = True
        else:
            self.lines.append(change.line(event_type))
        self.wake.set()

    def _event_type(self, change: Change) -> str | None:
        now = change.type != "DELETED" and self.selection.matches(change.entry.obj)
        if change.type == "ADDED":
            return "ADDED" if now else None
        if change.type == "DELETED":
            return "DELETED" if self.selection.matches(change.entry.obj) else None
        before = change.old is not None and self.selection.matches(change.old.obj)
        if now:
            return "MODIFIED" if before else "ADDED"
        return "DELETED" if before else None

    def close(self) -> None:
        self.closed = True
        self.wake.set()


class Store:
    def __init__(self, history: int = 10_000, watch_queue: int = 100_000) -> None:
        self.rv = 1  # never "0": that means "any version" to a watch
        self.compacted = 0  # the newest resourceVersion no longer in the history
        self.history: deque[Change] = deque()
        self.history_size = max(1, history)
        self.watch_queue = watch_queue
        self.objects: dict[str, dict[Key, Entry]] = {}
        self.watchers: dict[str, set[Watcher]] = {}  # every open watch, by resource
        self._unindexed: dict[str, set[Watcher]] = {}
        self._by_node: dict[str, dict[str, set[Watcher]]] = {}

    def table(self, kind: Kind) -> dict[Key, Entry]:
        return self.objects.setdefault(kind.plural, {})

    def get(self, kind: Kind, key: Key) -> Entry | None:
        return self.table(kind).get(key)

    def put(self, kind: Kind, key: Key, obj: Obj) -> Entry:
        """Store a new version of an object (ADDED or MODIFIED) and tell watchers."""
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        entry = Entry(obj, _encode(obj))
        old = self.table(kind).get(key)
        self.table(kind)[key] = entry
        self._record(Change(self.rv, kind, "ADDED" if old is None else "MODIFIED", entry, old))
        return entry

    def remove(self, kind: Kind, key: Key) -> Entry:
        """Delete an object for good (DELETED); the answer carries the deletion's version."""
        old = self.table(kind).pop(key)
        self.rv += 1
        obj = old.copy()
        obj["metadata"]["resourceVersion"] = str(self.rv)
        entry = Entry(obj, _encode(obj))
        self._record(Change(self.rv, kind, "DELETED", entry, old))
        return entry

    def _record(self, change: Change) -> None:
        if len(self.history) >= self.history_size:
            self.compacted = self.history.popleft().rv
        self.history.append(change)
        for watcher in self._interested(change):
            watcher.offer(change)

    def _interested(self, change: Change) -> list[Watcher]:
        plural = change.kind.plural
        found = list(self._unindexed.get(plural, ()))
        buckets = self._by_node.get(plural)
        if buckets:
            nodes = {_node_of(change.entry.obj)}
            if change.old is not None:
                nodes.add(_node_of(change.old.obj))
            for node in nodes:
                found.extend(buckets.get(node, ()))
        return found

    def select(self, selection: Selection) -> Iterator[Entry]:
        table = self.table(selection.kind)
        if selection.namespace is None and not selection.labels and not selection.fields:
            return iter(list(table.values()))
        return (entry for entry in list(table.values()) if selection.matches(entry.obj))

    def watch(self, selection: Selection, since: int | None) -> tuple[Watcher, list[bytes]]:
        """Open a watch; the lines to send first are the current state or the replay."""
        if since is not None and since < self.compacted:
            raise gone(since, self.compacted + 1)
        watcher = Watcher(selection, self.watch_queue)
        if since is None:
            first = [event_line("ADDED", entry.raw) for entry in self.select(selection)]
        else:
            first = self._replay(watcher, since)
        self._register(watcher)
        return watcher, first

    def _bucket(self, watcher: Watcher) -> set[Watcher]:
        plural, node = watcher.selection.kind.plural, watcher.selection.index_key()
        if node is None:
            return self._unindexed.setdefault(plural, set())
        return self._by_node.setdefault(plural, {}).setdefault(node, set())

    def _register(self, watcher: Watcher) -> None:
        self.watchers.setdefault(watcher.selection.kind.plural, set()).add(watcher)
        self._bucket(watcher).add(watcher)

    def _replay(self, watcher: Watcher, since: int) -> list[bytes]:
        plural = watcher.selection.kind.plural
        watcher.capacity = 1 << 62  # the replay is bounded by the history already
        for change in self.history:
            if change.rv > since and change.kind.plural == plural:
                watcher.offer(change)
        first = list(watcher.lines)
        watcher.lines.clear()
        watcher.capacity = self.watch_queue
        return first

    def unwatch(self, watcher: Watcher) -> None:
        watcher.closed = True
        self.watchers.get(watcher.selection.kind.plural, set()).discard(watcher)
        self._bucket(watcher).discard(watcher)

    def close_watchers(self) -> None:
        for watchers in self.watchers.values():
            for watcher in list(watchers):
                watcher.close()
