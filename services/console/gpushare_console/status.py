"""The console's ``/status`` (its response model: ``/openapi.json``, ``/docs``)."""

from __future__ import annotations

from gpushare_common.http import Model, ServiceStatus


class Timeline(Model):
    owner_backs: int
    """Owner-backs kept."""
    records: int
    """Eviction records kept."""


class ConsoleStatus(ServiceStatus):
    """The cluster view: what it follows and how far it has read."""

    nats: bool
    """Connected to NATS."""
    nodes: list[str]
    pods: int
    cards: dict[str, int]
    """Cards by state, over every node's solver view."""
    synced: list[str]
    """The sources read in full once (pods, nodes, the buckets)."""
    timeline: Timeline
    stream_cursors: dict[str, int]
    """The last stream sequence read, per follower."""
    inputs_skipped: dict[str, int]
    """Inputs that could not be read, by source."""
    version: int
    """Bumped on every change the page shows."""
