"""Build a detector against real servers (NATS, API emulator, pod-resources) for tests and the benchmark."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from gpushare_common import events as ev
from gpushare_common.adapters.podresources import PodResources
from gpushare_common.bus import Bus
from gpushare_common.pods import PodRules
from gpushare_detector.away import AwayMachine
from gpushare_detector.detector import Detector
from gpushare_detector.kmod import KmodSync
from gpushare_detector.metrics import DetectorMetrics
from gpushare_detector.pods import PodTracker
from gpushare_detector.scraper import Scraper
from prometheus_client import CollectorRegistry

NODE = "node-1"


class KmodBridge:
    """A tiny kmod-bridge stand-in: records commands, answers stats from a table."""

    def __init__(self) -> None:
        self.commands: list[ev.KmodCommand] = []
        self.hits: dict[str, int] = {}  # by ns/pod/container
        self.placed: dict[str, ev.Placement] = {}  # what the adds said
        self.processes: dict[int, tuple[str, str]] = {}  # host pid -> (pod, container)
        self.changed = asyncio.Event()

    async def respond(self, event: ev.AnyEvent) -> ev.Event:
        assert isinstance(event, ev.KmodCommand)
        self.commands.append(event)
        self.changed.set()
        self.placed.update({p.container: p for p in event.placements})
        # like the bridge, statistics name the pod ("ns/pod"), its container and where it was placed
        stats = tuple(ev.NamespaceStats(pidns=i + 1, pod=p.rpartition("/")[0], container=p.rpartition("/")[2],
                                        role=self.placed[p].role if p in self.placed else "", hits=self.hits[p])
                      for i, p in enumerate(event.pods) if p in self.hits) if event.op == "stats" else ()
        named = tuple(ev.ProcessOwner(pid=p, pod=self.processes[p][0], container=self.processes[p][1])
                      for p in event.pids if p in self.processes)  # fmt: skip
        return ev.KmodReply(node=event.node, op=event.op, status=0, stats=stats, processes=named)

    def containers(self) -> set[str]:
        live: set[str] = set()
        for command in self.commands:
            if command.op == "add":
                live.update(command.pods)
            elif command.op == "delete":
                live.difference_update(command.pods)
        return live


class Collector:
    """Every event published on the node's event subjects, in order."""

    def __init__(self) -> None:
        self.events: list[ev.AnyEvent] = []
        self.arrived = asyncio.Event()

    async def __call__(self, event: ev.AnyEvent) -> None:
        self.events.append(event)
        self.arrived.set()

    async def wait_for(self, predicate: Callable[[ev.AnyEvent], bool], timeout: float = 5.0) -> ev.AnyEvent:
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for event in self.events[seen:]:
                if predicate(event):
                    return event
            seen = len(self.events)
            self.arrived.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no matching event among {self.events!r}")
            await asyncio.wait_for(self.arrived.wait(), left)


def build(bus: Bus, socket: str, *, scraper: Scraper | None = None, window_s: float = 600.0,
          clock: Callable[[], float] = time.monotonic, rules: PodRules | None = None) -> Detector:
    metrics = DetectorMetrics(CollectorRegistry())
    return Detector(
        node=NODE, tracker=PodTracker(rules or PodRules(), NODE), bus=bus,
        devices=PodResources(socket, timeout_s=2.0), kmod=KmodSync(bus, NODE, 1.0, metrics),
        away=AwayMachine(NODE, window_s, clock), scraper=scraper, metrics=metrics, clock=clock)


async def stream_messages(bus: Bus) -> int:
    """Events stored in the stream for this node (kmod commands excluded)."""
    return len(await bus.read_after(bus.subjects.node_events(NODE), 0))


def is_(kind: type[ev.Event], **fields: Any) -> Callable[[ev.AnyEvent], bool]:
    return lambda e: isinstance(e, kind) and all(getattr(e, k) == v for k, v in fields.items())
