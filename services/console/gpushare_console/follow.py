"""The console's followers: each keeps one part of :class:`~.state.ClusterState` current.

- the Kubernetes API: pods and nodes (and, with ``dra``, ResourceClaims and ResourceSlices),
  list + watch (the adapter resumes and re-lists);
- the solver's bucket and the health bucket: key-value watches (every key, then each change);
- the event stream: eviction records and owner-back events by direct gets from the start of
  what the stream holds, then every ``poll_s`` (the newest ``keep`` are kept);
- SpareCapacity events (a core subscription) for the size of one vcpu/vmem device;
- GpuActivity events (a core subscription): each node's per-pod GPU activity.

Each node's stream and buckets live on its leaf server, in its own JetStream domain
(``Layout.node_domain``): :meth:`Followers.nodes_nats` follows every node the API lists
through its domain, one :class:`NodeFollowers` per node, started and stopped as nodes come
and go. With ``domain=""`` the same followers read the server the console is connected to
(one server holding every node's state).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from gpushare_common.adapters.kube import PodChange
from gpushare_common.bus import Bus, BusError
from gpushare_common.events import (
    AnyEvent,
    EventDecodeError,
    EvictionRecord,
    GpuActivity,
    OwnerBackEvent,
    SpareCapacity,
)
from gpushare_common.http import Health
from gpushare_common.retry import Backoff, Supervised

from .metrics import ConsoleMetrics
from .settings import ConsoleSettings
from .state import ClusterState

_BATCH = 500


class Followers:
    def __init__(self, state: ClusterState, settings: ConsoleSettings, health: Health,
                 metrics: ConsoleMetrics) -> None:  # fmt: skip
        self.state = state
        self.settings = settings
        self.health = health
        self.metrics = metrics
        self.cursors: dict[str, int] = {}

    def _ready(self) -> None:
        synced = self.state.synced
        self.health.set("kube", {"nodes", "pods"} <= synced, "listed" if {"nodes", "pods"} <= synced else "")
        self.health.set("state", {"solver", "health"} <= synced, "")

    async def kube(self, source: str, changes: AsyncIterator[PodChange],
                   apply: Callable[[str, dict[str, Any] | None, list[dict[str, Any]]], None]) -> None:
        """One kind of Kubernetes object (``source``), listed then watched, into the state."""
        async for change in changes:
            apply(change.kind, change.pod, change.pods)
            self.metrics.updates.labels(source).inc()
            self._ready()

    async def solver(self, bus: Bus, stop: asyncio.Event, node: str = "", domain: str = "") -> None:
        """The solver's bucket (of one node's leaf server, or of every node on one server)."""
        keys = bus.layout.scope(node, ">") if node else ">"  # one node's keys, or every key
        async for batch in bus.watch_bucket("solver", keys, stop, self.settings.heartbeat_s, domain):
            self.state.solver_changed(batch, node)
            self.metrics.updates.labels("solver").inc()
            self._ready()

    async def health_bucket(self, bus: Bus, stop: asyncio.Event, node: str = "", domain: str = "") -> None:
        keys = bus.layout.scope(node, ">") if node else ">"  # one node's keys, or every key
        async for batch in bus.watch_bucket("health", keys, stop, self.settings.heartbeat_s, domain):
            self.state.health_changed(batch, node)
            self.metrics.updates.labels("health").inc()
            self._ready()

    async def stream(self, bus: Bus, stop: asyncio.Event, node: str = "", domain: str = "") -> None:
        """Eviction records and owner-backs, read from the start of the stream, then as they come."""
        subjects = bus.subjects
        found = (subjects.eviction(node), subjects.event(node, "ownerback")) if node else \
            (subjects.every_node_eviction(), subjects.every_node_event("ownerback"))
        self.cursors.update(dict.fromkeys(found, 0))
        more = asyncio.Event()  # a full batch: read on at once
        more.set()
        async for reading in Supervised("read the event stream", stop, Backoff(0.5, 5.0), wake=more,
                                        every_s=self.settings.poll_s, node=node or "every node"):  # fmt: skip
            try:
                fresh = [await self._read(bus, subject, domain) for subject in found]
            except BusError as err:
                self.metrics.stream_errors.inc()
                reading.failed(err)
                continue
            reading.progress()
            if any(fresh):
                self.state.changes.bump()
            if max(fresh) >= _BATCH:
                more.set()

    async def nodes_nats(self, bus: Bus, stop: asyncio.Event, every_s: float = 1.0) -> None:
        """Follow each node the API lists through its leaf server's domain, until ``stop``."""
        running: dict[str, asyncio.Task[None]] = {}
        try:
            async for _ in Supervised("follow the nodes' leaf servers", stop, every_s=every_s):
                for node in set(self.state.nodes) - set(running):
                    running[node] = asyncio.ensure_future(self._node(bus, node, stop))
                for node in set(running) - set(self.state.nodes):
                    running.pop(node).cancel()
        finally:
            for task in running.values():
                task.cancel()
            await asyncio.gather(*running.values(), return_exceptions=True)

    async def _node(self, bus: Bus, node: str, stop: asyncio.Event) -> None:
        domain = bus.layout.node_domain(node)
        await asyncio.gather(self.solver(bus, stop, node, domain), self.health_bucket(bus, stop, node, domain),
                             self.stream(bus, stop, node, domain))  # fmt: skip

    async def _read(self, bus: Bus, subject: str, domain: str) -> int:
        found = await bus.read_after(subject, self.cursors[subject], _BATCH, domain)
        for message in found:
            self.cursors[subject] = message.seq
            with contextlib.suppress(EventDecodeError):
                event = message.event()
                if isinstance(event, OwnerBackEvent | EvictionRecord):
                    self.state.timeline.add(event)
                    self.metrics.updates.labels("stream").inc()
                    continue
            self.metrics.skipped.labels("stream").inc()
        return len(found)

    async def activity(self, event: AnyEvent) -> None:
        if isinstance(event, GpuActivity):
            self.state.activity_seen(event)

    async def capacity(self, event: AnyEvent) -> None:
        if isinstance(event, SpareCapacity):
            self.state.capacity_seen(event)
