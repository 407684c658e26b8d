"""Lifecycle of the console: serve HTTP at once, follow the Kubernetes API, connect to NATS as the
read-only ``observer`` and follow the buckets and the event stream, drain on stop.

The page is served while NATS or the API is still unreachable (``/readyz`` says which part is
missing: ``nats``, ``kube`` (nodes and pods listed), ``state`` (both buckets read)).
Nothing here writes anything anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from gpushare_common.adapters.kube import Kube
from gpushare_common.bus import Bus
from gpushare_common.http import Health, build_app, serve
from gpushare_common.logging import get_logger
from gpushare_common.settings import CommonSettings
from gpushare_common.tasks import Tasks, wait_first
from prometheus_client import CollectorRegistry

from .follow import Followers
from .metrics import ConsoleMetrics
from .routes import add_routes
from .settings import ConsoleSettings
from .state import ClusterState

SERVICE = "console"
ROLE = "observer"  # the NATS role: reads the stream and every bucket, writes nothing
log = get_logger(SERVICE)


def status(state: ClusterState, followers: Followers, bus: Bus) -> dict[str, Any]:
    cards = [c.state for view in state.solver.values() for c in view.cards()]
    return {
        "nats": bus.is_connected, "nodes": sorted(state.nodes), "pods": len(state.pods),
        "cards": {s: cards.count(s) for s in sorted(set(cards))}, "synced": sorted(state.synced),
        "timeline": {"owner_backs": len(state.timeline.owner_backs), "records": len(state.timeline.records)},
        "stream_cursors": followers.cursors, "inputs_skipped": dict(state.problems),
        "version": state.changes.version,
    }  # fmt: skip


async def follow_nats(bus: Bus, followers: Followers, stop: asyncio.Event) -> None:
    """Connect (retrying), wait for the stream, then follow the buckets, the stream and capacity."""
    await bus.connect(stop)
    await bus.wait_for_stream(stop)
    await bus.subscribe(bus.subjects.every_node_capacity(), followers.capacity)
    await asyncio.gather(followers.solver(bus, stop), followers.health_bucket(bus, stop),
                         followers.stream(bus, stop))  # fmt: skip


async def run(common: CommonSettings, settings: ConsoleSettings, stop: asyncio.Event) -> int:
    registry = CollectorRegistry()
    metrics = ConsoleMetrics(registry)
    health = Health("nats", "kube", "state")
    state = ClusterState(settings.rules(common.kube.system_namespace), settings.keep,
                         on_problem=lambda source: metrics.skipped.labels(source).inc())  # fmt: skip
    followers = Followers(state, settings, health, metrics)
    tasks = Tasks(SERVICE, stop)
    stopping = asyncio.Event()
    async with contextlib.AsyncExitStack() as stack:
        bus = Bus(common.nats, ROLE, registry)
        bus.on_state.append(lambda up: health.set("nats", up, "" if up else "disconnected"))
        stack.push_async_callback(bus.drain)
        kube = Kube(common.kube)
        stack.callback(kube.api.close)
        app = build_app(SERVICE, health, registry, lambda: status(state, followers, bus))
        add_routes(app, state, settings, metrics, stopping)
        await stack.enter_async_context(serve(app, common.http))
        stack.callback(state.changes.bump)  # live streams end first: wake them once stopping is set
        stack.callback(stopping.set)
        stack.push_async_callback(tasks.cancel_all)
        tasks.spawn("pods", followers.pods(kube, stop))
        tasks.spawn("nodes", followers.nodes(kube, stop))
        tasks.spawn("nats", follow_nats(bus, followers, stop))
        log.info("console up", port=common.http.port, nats=common.nats.url)
        await wait_first(stop, tasks)
    return 1 if tasks.failure is not None else 0
