"""A fleet worker: one process emulating its share of the nodes, driven by JSON lines on stdin.

  python -m bench.fleet.worker --servers 127.0.0.1:4222,... --index 0 --workers 1

Commands, one JSON object a line; each gets one JSON line back on stdout:

- ``{"op": "grow", "nodes": K, "rate": R}``: start this worker's share of nodes
  0..K-1 (R nodes a second); answers once each has its durable consumer (or it
  was refused), or after ``timeout`` seconds. With ``"servers": ["host:port", ...]``
  node ``i`` connects only to the ``i``-th (its own leaf server), not to ``--servers``.
- ``{"op": "pause"}`` / ``{"op": "resume"}``: stop or restart every node's
  traffic (fetches, publishes, pings); connections and consumers stay.
- ``{"op": "stats"}``: cumulative counters, the process's CPU seconds, and how
  late the clock's ticks ran since the last stats (the emulator's own
  saturation: a tick that runs late means this process, not the servers, was
  short of CPU).
- ``{"op": "stop"}``: close every connection and exit.

The clock ticks every 100 ms; each periodic action of each node has a random
phase within its period, so the fleet's load is spread evenly in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpushare_common.layout import Layout

from bench.fleet.emulator import FleetNode, Tally
from bench.fleet.model import CONNECTIONS, Periods, Profile

TICK_S = 0.1
WATCHDOG_S = 0.5


@dataclass
class Schedule:
    """Nodes' periodic actions in slots of one tick: slot ``t % slots`` fires at tick ``t``."""

    period_s: float
    action: Callable[[FleetNode], None]
    buckets: list[list[FleetNode]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.buckets = [[] for _ in range(max(1, round(self.period_s / TICK_S)))]

    def add(self, node: FleetNode) -> None:
        random.choice(self.buckets).append(node)

    def fire(self, tick: int) -> None:
        for node in self.buckets[tick % len(self.buckets)]:
            if node.running:
                self.action(node)


class Worker:
    def __init__(self, servers: list[tuple[str, int]], index: int, workers: int, layout: Layout,
                 profile: Profile) -> None:  # fmt: skip
        self.servers, self.index, self.workers = servers, index, workers
        self.layout, self.profile = layout, profile
        self.tally = Tally()
        self.nodes: list[FleetNode] = []
        self.running = True
        self.churn_due = 0.0
        self.lag_ms: list[float] = []
        periods = Periods.from_code()
        capacity_s = periods.capacity_s if profile.capacity_moves else periods.capacity_republish_s
        self.schedules = [Schedule(periods.resync_s, FleetNode.resync), Schedule(capacity_s, FleetNode.capacity),
                          Schedule(periods.owners_s, lambda n: n.kmod("stats")),
                          Schedule(periods.health_resync_s, FleetNode.health_gets),
                          Schedule(WATCHDOG_S, lambda n: n.watchdog(time.monotonic()))]  # fmt: skip
        self.schedules += [Schedule(periods.ping_s, lambda n, r=role: n.ping(r)) for role in CONNECTIONS]  # type: ignore[misc]

    async def grow(self, total: int, rate: float, timeout: float,
                   own: list[tuple[str, int]] | None = None) -> dict[str, object]:  # fmt: skip
        mine = [i for i in range(total) if i % self.workers == self.index][len(self.nodes):]
        started = time.monotonic()
        opening = []
        for number, index in enumerate(mine):
            servers = [own[index]] if own else self.servers
            node = FleetNode(index, self.layout, self.profile, servers, self.tally)
            node.running = self.running
            self.nodes.append(node)
            for schedule in self.schedules:
                schedule.add(node)
            opening.append(asyncio.ensure_future(node.open()))
            await asyncio.sleep(max(0.0, started + (number + 1) / rate - time.monotonic()))
        await asyncio.gather(*opening)
        deadline = started + timeout
        while self._settled() < len(self.nodes) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return {"nodes": len(self.nodes), "ready": self.tally.ready, "seconds": time.monotonic() - started}

    def _settled(self) -> int:
        return self.tally.ready + self.tally.refused

    def pause(self, running: bool) -> None:
        self.running = running
        for node in self.nodes:
            node.running = running
            if running:
                node.pull()

    async def clock(self) -> None:
        loop = asyncio.get_running_loop()
        start, tick = loop.time(), 0
        while True:
            tick += 1
            due = start + tick * TICK_S
            await asyncio.sleep(max(0.0, due - loop.time()))
            self.lag_ms.append((loop.time() - due) * 1000)
            if not self.running:
                continue
            for schedule in self.schedules:
                schedule.fire(tick)
            self._churn()

    def _churn(self) -> None:
        self.churn_due += self.profile.churn_per_hour / 3600 * len(self.nodes) * TICK_S
        while self.churn_due >= 1 and self.nodes:
            self.churn_due -= 1
            random.choice(self.nodes).churn()

    def stats(self) -> dict[str, object]:
        links = [link for node in self.nodes for link in node.links.values()]
        lag, self.lag_ms = sorted(self.lag_ms) or [0.0], []
        return {
            "nodes": len(self.nodes), "ready": self.tally.ready, "refused": self.tally.refused,
            "cpu_s": time.process_time(),
            "sent": dict(self.tally.sent), "answers": dict(self.tally.answers), "errors": dict(self.tally.errors),
            "lag_ms_p50": lag[len(lag) // 2], "lag_ms_max": lag[-1],
            "connected": sum(link.connected for link in links), "links": len(links),
            "losses": sum(link.stats.losses for link in links), "dropped": sum(link.stats.dropped for link in links),
            "server_errors": sum(link.stats.errors for link in links),
            "last_server_error": next((link.stats.last_error for link in links if link.stats.last_error), ""),
        }

    def stop(self) -> None:
        for node in self.nodes:
            node.close()


def _address(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


async def serve(worker: Worker) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    clock = asyncio.ensure_future(worker.clock())
    try:
        while line := await reader.readline():
            command = json.loads(line)
            op = command["op"]
            answer: dict[str, object] = {"op": op}
            if op == "grow":
                own = [_address(a) for a in command.get("servers", [])]
                answer |= await worker.grow(command["nodes"], command.get("rate", 100.0), command.get("timeout", 60.0),
                                            own)  # fmt: skip
            elif op in ("pause", "resume"):
                worker.pause(op == "resume")
            elif op == "stats":
                answer |= worker.stats()
            elif op == "stop":
                break
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()
    finally:
        clock.cancel()
        worker.stop()
        await asyncio.sleep(0.2)  # let the transports close


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet.worker")
    parser.add_argument("--servers", required=True, help="host:port,host:port,...")
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--prefix", default=Layout().prefix)
    parser.add_argument("--stream", default=Layout().stream)
    parser.add_argument("--kv-prefix", default=Layout().kv_prefix)
    parser.add_argument("--profile", default="{}", help="Profile fields as JSON")
    args = parser.parse_args()
    servers = [_address(s) for s in args.servers.split(",")]
    worker = Worker(servers, args.index, args.workers, Layout(args.prefix, args.stream, args.kv_prefix),
                    Profile(**json.loads(args.profile)))  # fmt: skip
    asyncio.run(serve(worker))


if __name__ == "__main__":
    main()
