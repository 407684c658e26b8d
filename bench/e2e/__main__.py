"""End-to-end benchmark: scenario 3's owner-back latency and every service's memory.

  python -m bench.e2e [--trials 100] [--away-window 1.0]

On the whole local cluster (every service its own process, real containers
when root): a lendable dev machine goes away, a spot pod borrows its card,
the owner issues one GPU ioctl; per trial: owner's ioctl -> borrower's tasks
dead (the solver's eviction record, less its API delete time) and -> owner's
call returns (the workload's own report, written right after the ioctl
returns). The away window is shortened so trials take seconds. Meanwhile the
resident memory of every service process is sampled (target <= 100 MB each).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from contextlib import AsyncExitStack
from dataclasses import replace

from gpushare_sim.run.cluster import Cluster, ClusterSettings
from gpushare_sim.run.kubeapi import ensure_namespace
from gpushare_sim.run.narrate import Timeline
from gpushare_sim.run.services import ServiceSettings
from gpushare_sim.scenarios.kit import Scenario, open_clients, recording
from gpushare_sim.scenarios.spot import Trial, lend, owner_back, setup_owner

from bench.report import Row, emit, median, percentile

PART = "e2e"
RSS_TARGET_MB = 100.0
SERVICES = ("detector", "solver", "deviceplugin", "kmod-bridge", "shadow-controller", "console", "nats-auth")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.e2e", description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=100, help="owner-back trials")
    p.add_argument("--away-window", type=float, default=1.0, help="the detector's away window (s)")
    p.add_argument("--quiet", action="store_true", help="no per-trial lines")
    return p.parse_args(argv)


async def sample_rss(cluster: Cluster, peaks: dict[str, int], stop: asyncio.Event) -> None:
    """Keep the highest RSS of every service process until ``stop``."""
    while not stop.is_set():
        for name, child in cluster.children.items():
            service = name.split("@")[0]
            if service in SERVICES:
                peaks[service] = max(peaks.get(service, 0), child.rss_bytes())
        try:
            await asyncio.wait_for(stop.wait(), 0.25)
        except TimeoutError:
            pass


async def trials(s: Scenario, count: int, quiet: bool) -> list[Trial]:
    node = s.cluster.nodes[0].name
    card, report_dir = await setup_owner(s, node)
    done: list[Trial] = []
    for index in range(count):
        borrower = f"borrower-{index}"
        await lend(s, node, card, borrower)
        trial = await owner_back(s, report_dir, borrower)
        done.append(trial)
        if not quiet:
            s.say(f"trial {index + 1}/{count}: tasks dead {trial.borrower_killed * 1000:.1f} ms, "
                  f"owner returned {trial.owner_returned * 1000:.1f} ms")  # fmt: skip
    return done


def rows(done: list[Trial], peaks: dict[str, int]) -> list[Row]:
    dead = [t.borrower_killed * 1000 for t in done]
    back = [t.owner_returned * 1000 for t in done]
    out = [Row(PART, "owner-back trials", len(done), "trials")]
    for label, samples in (("ioctl -> borrowers' tasks dead", dead), ("ioctl -> owner's call returns", back)):
        out.append(Row(PART, f"owner-back {label} p50", median(samples), "ms"))
        out.append(Row(PART, f"owner-back {label} p99", percentile(samples, 99), "ms"))
    for service in SERVICES:
        mb = peaks.get(service, 0) / (1 << 20)
        out.append(Row(PART, f"RSS {service} during scenario 3 (max)", mb, "MB",
                       f"<= {RSS_TARGET_MB:.0f}", mb <= RSS_TARGET_MB))  # fmt: skip
    return out


async def run(args: argparse.Namespace) -> list[Row]:
    timeline = Timeline()
    services = replace(ServiceSettings(), away_window_s=args.away_window, scrape_s=0.25)
    peaks: dict[str, int] = {}
    stop = asyncio.Event()
    async with Cluster(ClusterSettings(services=services), timeline) as cluster, AsyncExitStack() as stack:
        kube, bus = await open_clients(cluster, stack)
        sampler = asyncio.create_task(sample_rss(cluster, peaks, stop))
        try:
            started = time.monotonic()
            scenario = Scenario("bench-e2e", cluster, timeline, kube, bus)
            await asyncio.to_thread(ensure_namespace, cluster.kubeconfig, scenario.namespace)
            async with recording(scenario) as s:
                done = await trials(s, args.trials, args.quiet)
            timeline.step(f"{len(done)} owner-back trials in {time.monotonic() - started:.0f}s")
        finally:
            stop.set()
            await sampler
    return rows(done, peaks)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.trials < 1:
        print("--trials must be >= 1", file=sys.stderr)
        return 2
    emit(asyncio.run(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
