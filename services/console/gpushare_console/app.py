"""Lifecycle of the console: serve HTTP at once, follow the Kubernetes API, connect to NATS as the
read-only ``observer`` and follow the buckets and the event stream, drain on stop.

The page is served while NATS or the API is still unreachable (``/readyz`` says which part is
missing: ``nats``, ``kube`` (nodes and pods listed), ``state`` (both buckets read)).
Nothing here writes anything anywhere.

- Consumes: the event stream (owner-backs, evictions), the ``solver`` and ``health`` buckets
  (watched), every node's spare capacity (core subjects), pods and nodes (API server watch).
- Publishes: nothing; the page, its live updates (server-sent events) and ``/api`` to browsers.
- Runs: pod and node followers, NATS followers; HTTP.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gpushare_common.adapters.kube import Kube
from gpushare_common.bus import Bus
from gpushare_common.logging import get_logger
from gpushare_common.service import Skeleton
from gpushare_common.settings import CommonSettings

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
    async with Skeleton(SERVICE, common.http, "nats", "kube", "state", stop=stop) as svc:
        metrics = ConsoleMetrics(svc.registry)
        state = ClusterState(settings.rules(common.kube.system_namespace), settings.keep,
                             on_problem=lambda source: metrics.skipped.labels(source).inc())  # fmt: skip
        followers = Followers(state, settings, svc.health, metrics)
        bus = svc.bus(common.nats, role=ROLE)  # drained last
        kube = Kube(common.kube)
        svc.on_exit(kube.close)
        await svc.serve(lambda: status(state, followers, bus),
                        lambda app: add_routes(app, state, settings, metrics, svc.stopping))
        svc.on_exit(state.changes.bump)  # live streams end first: woken once ``stopping`` is set
        svc.spawn("pods", followers.pods(kube, stop))
        svc.spawn("nodes", followers.nodes(kube, stop))
        svc.spawn("nats", follow_nats(bus, followers, stop))
        log.info("console up", port=svc.port, nats=common.nats.url)
        await svc.run_until_stopped()
    return svc.exit_code
