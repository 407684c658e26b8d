"""Open watches: bounded queues of encoded event lines, found by resource and node."""

from __future__ import annotations

import asyncio
from collections import deque

from .records import Change, Selection, node_of


class Watcher:
    """One open watch: a bounded queue of encoded event lines."""

    def __init__(self, selection: Selection, capacity: int, after: int = 0) -> None:
        self.selection = selection
        self.capacity = capacity
        self.after = after  # changes up to this resourceVersion are not sent
        self.lines: deque[bytes] = deque()
        self.wake = asyncio.Event()
        self.overflowed = False
        self.closed = False

    def offer(self, change: Change) -> None:
        if self.overflowed or self.closed or change.rv <= self.after:
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


class WatcherIndex:
    """Every open watch by resource; those limited to one node also by that node, so a
    change reaches only the watchers that may want it."""

    def __init__(self) -> None:
        self.by_resource: dict[str, set[Watcher]] = {}
        self._unindexed: dict[str, set[Watcher]] = {}
        self._by_node: dict[str, dict[str, set[Watcher]]] = {}

    def _bucket(self, watcher: Watcher) -> set[Watcher]:
        plural, node = watcher.selection.kind.plural, watcher.selection.index_key()
        if node is None:
            return self._unindexed.setdefault(plural, set())
        return self._by_node.setdefault(plural, {}).setdefault(node, set())

    def add(self, watcher: Watcher) -> None:
        self.by_resource.setdefault(watcher.selection.kind.plural, set()).add(watcher)
        self._bucket(watcher).add(watcher)

    def discard(self, watcher: Watcher) -> None:
        self.by_resource.get(watcher.selection.kind.plural, set()).discard(watcher)
        self._bucket(watcher).discard(watcher)

    def interested(self, change: Change) -> list[Watcher]:
        plural = change.kind.plural
        found = list(self._unindexed.get(plural, ()))
        buckets = self._by_node.get(plural)
        if buckets:
            nodes = {node_of(change.entry.obj)}
            if change.old is not None:
                nodes.add(node_of(change.old.obj))
            for node in nodes:
                found.extend(buckets.get(node, ()))
        return found

    def close_all(self) -> None:
        for watchers in self.by_resource.values():
            for watcher in list(watchers):
                watcher.close()
