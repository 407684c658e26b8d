"""In-memory object store: one resourceVersion counter, a bounded change history, watchers.

Everything here runs on the server's event loop thread; no method awaits, so
every operation is atomic with respect to the others.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from .errors import gone
from .kinds import Kind
from .records import Change, Entry, Key, Obj, Selection, encode, event_line, node_of
from .tokens import SigningKey
from .watchers import Watcher, WatcherIndex

__all__ = ["Entry", "Key", "Obj", "Selection", "Store", "Watcher", "event_line"]


class Store:
    def __init__(self, history: int = 10_000, watch_queue: int = 100_000) -> None:
        self.rv = 1  # never "0": that means "any version" to a watch
        self.compacted = 0  # the newest resourceVersion no longer in the history
        self.history: deque[Change] = deque()
        self.history_size = max(1, history)
        self.watch_queue = watch_queue
        self.objects: dict[str, dict[Key, Entry]] = {}
        self._on_node: dict[str, dict[str, dict[Key, None]]] = {}  # resource -> node -> keys
        self._watchers = WatcherIndex()
        self.signing_key = SigningKey.generate()  # signs service-account tokens

    @property
    def watchers(self) -> dict[str, set[Watcher]]:
        """Every open watch, by resource (plural)."""
        return self._watchers.by_resource

    def table(self, kind: Kind) -> dict[Key, Entry]:
        return self.objects.setdefault(kind.plural, {})

    def get(self, kind: Kind, key: Key) -> Entry | None:
        return self.table(kind).get(key)

    def put(self, kind: Kind, key: Key, obj: Obj) -> Entry:
        """Store a new version of an object (ADDED or MODIFIED) and tell watchers."""
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        entry = Entry(obj, encode(obj))
        old = self.table(kind).get(key)
        self.table(kind)[key] = entry
        self._index(kind, key, old, entry)
        self._record(Change(self.rv, kind, "ADDED" if old is None else "MODIFIED", entry, old))
        return entry

    def remove(self, kind: Kind, key: Key) -> Entry:
        """Delete an object for good (DELETED); the answer carries the deletion's version."""
        old = self.table(kind).pop(key)
        self._index(kind, key, old, None)
        self.rv += 1
        obj = old.copy()
        obj["metadata"]["resourceVersion"] = str(self.rv)
        entry = Entry(obj, encode(obj))
        self._record(Change(self.rv, kind, "DELETED", entry, old))
        return entry

    def _index(self, kind: Kind, key: Key, old: Entry | None, new: Entry | None) -> None:
        before = node_of(old.obj) if old is not None else ""
        after = node_of(new.obj) if new is not None else ""
        if before == after:
            return
        nodes = self._on_node.setdefault(kind.plural, {})
        if before:
            nodes[before].pop(key, None)
        if after:
            nodes.setdefault(after, {})[key] = None

    def _record(self, change: Change) -> None:
        if len(self.history) >= self.history_size:
            self.compacted = self.history.popleft().rv
        self.history.append(change)
        for watcher in self._watchers.interested(change):
            watcher.offer(change)

    def select(self, selection: Selection) -> Iterator[Entry]:
        table = self.table(selection.kind)
        node = selection.index_key()
        if node is not None:
            keys = self._on_node.get(selection.kind.plural, {}).get(node, {})
            candidates = [table[key] for key in keys]
        else:
            candidates = list(table.values())
        if selection.namespace is None and not selection.labels and not selection.fields:
            return iter(candidates)
        return (entry for entry in candidates if selection.matches(entry.obj))

    def watch(self, selection: Selection, since: int | None) -> tuple[Watcher, list[bytes]]:
        """Open a watch; the lines to send first are the current state or the replay."""
        if since is not None and since < self.compacted:
            raise gone(since, self.compacted + 1)
        watcher = Watcher(selection, self.watch_queue, self.rv if since is None else since)
        if since is None:
            first = [event_line("ADDED", entry.raw) for entry in self.select(selection)]
        else:
            first = self._replay(watcher, since)
        self._watchers.add(watcher)
        return watcher, first

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
        self._watchers.discard(watcher)

    def status(self) -> dict[str, object]:
        """What the store holds, for /status."""
        return {
            "resourceVersion": self.rv,
            "oldestWatchableVersion": self.compacted,
            "history": len(self.history),
            "objects": {plural: len(table) for plural, table in self.objects.items()},
            "watchers": {plural: len(open_) for plural, open_ in self.watchers.items()},
        }

    def close_watchers(self) -> None:
        self._watchers.close_all()
