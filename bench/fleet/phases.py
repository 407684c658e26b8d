"""The benchmark's phases: what the servers cost over a window, owner-back trials with the fleet
running or paused, and owner-backs while the stream's leader is killed and restarted."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench.fleet.fleet import Fleet, FleetStats
from bench.fleet.owner import RealNode, TrialResult
from bench.fleet.servers import Holdings, NatsCluster

HEALTHY_WAIT_S = 45.0


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


@dataclass
class Window:
    """What one measuring window saw: per-second rates and CPU in cores."""

    nodes: int
    ready: int  # nodes whose durable consumer exists
    seconds: float
    server_cpu: dict[str, float]  # cores, per server
    server_rss: dict[str, int]  # bytes, per server, at the end
    fleet_cpu: float  # cores, every worker together
    machine_busy: float  # share of the machine's CPUs busy, everything included
    load: float  # the machine's 1-minute load average at the end
    sent: dict[str, float]  # the fleet's messages per second, by kind
    answers: dict[str, float]
    errors: Counter[str]  # errors during the window
    lag_ms_p50: float
    lag_ms_max: float
    holdings: Holdings

    @property
    def cpu(self) -> float:
        return sum(self.server_cpu.values())

    @property
    def rss(self) -> int:
        return sum(self.server_rss.values())


def _rates(after: Counter[str], before: Counter[str], seconds: float) -> dict[str, float]:
    return {k: (after[k] - before[k]) / seconds for k in after}


async def window(cluster: NatsCluster, fleet: Fleet, seconds: float) -> Window:
    stats0, cpu0, busy0, start = await fleet.stats(), cluster.cpu_s(), machine_ticks(), time.monotonic()
    await asyncio.sleep(seconds)
    stats1, cpu1, busy1 = await fleet.stats(), cluster.cpu_s(), machine_ticks()
    took = time.monotonic() - start
    return Window(
        nodes=stats1.nodes, ready=stats1.ready, seconds=took, server_cpu={n: (cpu1[n] - cpu0[n]) / took for n in cpu1},
        server_rss=cluster.rss(), fleet_cpu=(stats1.cpu_s - stats0.cpu_s) / took,
        machine_busy=(busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]), load=os.getloadavg()[0],
        sent=_rates(stats1.sent, stats0.sent, took), answers=_rates(stats1.answers, stats0.answers, took),
        errors=stats1.errors - stats0.errors, lag_ms_p50=stats1.lag_ms_p50, lag_ms_max=stats1.lag_ms_max,
        holdings=await asyncio.to_thread(cluster.holdings))


async def series(node: RealNode, trials: int, budget_s: float) -> list[TrialResult]:
    """``trials`` owner-backs, fewer when ``budget_s`` runs out first."""
    deadline, found = time.monotonic() + budget_s, list[TrialResult]()
    while len(found) < trials and time.monotonic() < deadline:
        found.append(await node.trial())
    return found


async def alternate(node: RealNode, fleet: Fleet, rounds: int, trials: int,
                    budget_s: float) -> dict[str, list[TrialResult]]:  # fmt: skip
    """Owner-backs with the fleet running and paused, in turns, ``trials`` a phase."""
    found: dict[str, list[TrialResult]] = {"running": [], "paused": []}
    for _ in range(rounds):
        for phase in ("running", "paused"):
            await (fleet.resume() if phase == "running" else fleet.pause())
            await asyncio.sleep(2.0)  # the fetch loops restart or drain
            found[phase] += await series(node, trials, budget_s)
    await fleet.resume()
    return found


@dataclass
class Failover:
    killed: list[str] = field(default_factory=list)  # the stream leader of each kill
    leaderless: int = 0  # kills not done: no server reported a leader of the stream within 30 s
    at_kill: list[TrialResult] = field(default_factory=list)  # the owner's call right after the kill
    while_down: list[TrialResult] = field(default_factory=list)  # trials while that server was down
    healthy_s: list[float] = field(default_factory=list)  # restart -> every server healthy again
    fleet_before: FleetStats | None = None
    fleet_after: FleetStats | None = None


async def failover(node: RealNode, fleet: Fleet, cluster: NatsCluster, stream: str, kills: int,
                   down_s: float, leaves: bool = False) -> Failover:  # fmt: skip
    """``kills`` times: borrowers ready, the stream's leader SIGKILLed (with ``leaves``, where the
    cluster holds no stream: each server in turn), at once the owner's call; more owner-backs
    while it is down; then it is restarted with its store."""
    found = Failover(fleet_before=await fleet.stats())
    members = sorted(cluster.members)
    for number in range(kills):
        leader = members[number % len(members)] if leaves else \
            await asyncio.to_thread(cluster.stream_leader, stream)
        if leader is None:
            found.leaderless += 1
            continue
        found.killed.append(leader)
        found.at_kill.append(await node.trial(before_call=lambda name=leader: cluster.kill(name)))  # type: ignore[misc]
        deadline = time.monotonic() + down_s
        while time.monotonic() < deadline:
            found.while_down.append(await node.trial())
        cluster.start(leader)
        try:
            found.healthy_s.append(await asyncio.to_thread(cluster.wait_healthy, HEALTHY_WAIT_S))
        except RuntimeError:
            found.healthy_s.append(float("inf"))  # not within the wait: reported as such
    found.fleet_after = await fleet.stats()
    return found
