"""Lifecycle of the console: serve HTTP at once, follow the Kubernetes API, connect to NATS as the
read-only ``observer`` and follow the buckets and the event stream, drain on stop.

The page is served while NATS or the API is still unreachable (``/readyz`` says which part is
missing: ``nats``, ``kube`` (nodes and pods listed), ``state`` (both buckets read)).
Nothing here writes anything anywhere.

- Consumes: the event stream (owner-backs, evictions), the ``solver`` and ``health`` buckets
  (watched), every node's spare capacity and GPU activity (core subjects), pods and nodes, with
  ``dra`` ResourceClaims and ResourceSlices (API server watch).
- Publishes: nothing; the page, its live updates (server-sent events) and ``/api`` to browsers.
- Runs: pod and node followers, NATS followers; HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from gpushare_common import dra
from gpushare_common.adapters.kube import Kube
from gpushare_common.bus import Bus
from gpushare_common.logging import get_logger
from gpushare_common.service import ServiceBase

from .follow import Followers
from .metrics import ConsoleMetrics
from .routes import add_routes
from .settings import Settings
from .state import ClusterState
from .status import ConsoleStatus

SERVICE = "console"
ROLE = "observer"  # the NATS role: reads the stream and every bucket, writes nothing
log = get_logger(SERVICE)


async def follow_nats(bus: Bus, followers: Followers, stop: asyncio.Event, node_domains: bool) -> None:
    """Connect (retrying), then follow capacity, and the buckets and the stream: every node's on
    its leaf server (``node_domains``), or the one server's, once its stream exists."""
    await bus.connect(stop)
    await bus.subscribe(bus.subjects.every_node_capacity(), followers.capacity)
    await bus.subscribe(bus.subjects.every_node_activity(), followers.activity)
    if node_domains:
        await followers.nodes_nats(bus, stop)
        return
    await bus.wait_for_stream(stop)
    await asyncio.gather(followers.solver(bus, stop), followers.health_bucket(bus, stop),
                         followers.stream(bus, stop))  # fmt: skip


class Service(ServiceBase):
    """The cluster view: its pages join the service's HTTP application (:meth:`routes`)."""

    status_model = ConsoleStatus

    def __init__(self, settings: Settings, stop: asyncio.Event | None = None) -> None:
        common, console = settings.common, settings.console
        super().__init__(SERVICE, common.http, "nats", "kube", "state", stop=stop)
        self.settings, self.nats_url = console, common.nats.url
        self.metrics = metrics = ConsoleMetrics(self.registry)
        self.state = ClusterState(console.rules(common.kube.system_namespace), console.keep,
                                  on_problem=lambda source: metrics.skipped.labels(source).inc())  # fmt: skip
        self.followers = Followers(self.state, console, self.health, metrics)
        self.bus = self.skeleton.bus(common.nats, console.instance, role=ROLE)  # drained last
        self.kube = Kube(common.kube)
        self.skeleton.on_exit(self.kube.close)

    def routes(self, app: FastAPI) -> None:
        add_routes(app, self.state, self.settings, self.metrics, self.stopping,
                   lambda token: self.kube.review_token(token, []))

    async def start(self) -> None:
        svc, stop = self.skeleton, self.skeleton.stop
        svc.on_exit(self.state.changes.bump)  # live streams end first: woken once ``stopping`` is set
        kube, state, follow = self.kube, self.state, self.followers
        svc.spawn("pods", follow.kube("pods", kube.watch_pods(stop), state.pods_changed))
        svc.spawn("nodes", follow.kube("nodes", kube.watch_nodes(stop), state.nodes_changed))
        if self.settings.dra:  # a DRA card's claims and spot mirror (gpushare's slices only)
            svc.spawn("claims", follow.kube("claims", kube.watch_resources(stop, "resourceclaims"),
                                            state.claims_changed))  # fmt: skip
            svc.spawn("slices", follow.kube("slices", kube.watch_resources(stop, "resourceslices",
                                                                           f"spec.driver={dra.DRIVER}"),
                                            state.slices_changed))  # fmt: skip
        svc.spawn("nats", follow_nats(self.bus, self.followers, stop, self.settings.node_domains))
        log.info("console up", port=svc.port, nats=self.nats_url)

    def status(self) -> Mapping[str, Any]:
        state, followers = self.state, self.followers
        cards = [c.state for view in state.solver.values() for c in view.cards()]
        return {
            "nats": self.bus.is_connected, "nodes": sorted(state.nodes), "pods": len(state.pods),
            "cards": {s: cards.count(s) for s in sorted(set(cards))}, "synced": sorted(state.synced),
            "timeline": {"owner_backs": len(state.timeline.owner_backs), "records": len(state.timeline.records)},
            "stream_cursors": followers.cursors, "inputs_skipped": dict(state.problems),
            "version": state.changes.version,
        }  # fmt: skip
