"""``python -m gpushare_sim.run --scenario NAME [--keep] [--nodes N]``.

Starts nats-server, the Kubernetes API emulator, the simulated nodes (fake
cards, kubelet stand-in, kernel stand-in) and every gpushare service as its
own process, plays the scenarios with a narrated timeline and prints a
summary table. ``--keep`` leaves everything up (status endpoints listed)
until Ctrl-C; Ctrl-C at any time tears everything down.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from gpushare_common import logging as gslog

from gpushare_sim.run.cluster import Cluster, ClusterSettings
from gpushare_sim.run.narrate import Timeline
from gpushare_sim.scenarios import SCENARIOS, play


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m gpushare_sim.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", default="all", help=f"all, none or one of: {', '.join(SCENARIOS)}")
    p.add_argument("--keep", action="store_true", help="leave everything up until Ctrl-C")
    p.add_argument("--nodes", type=int, default=1, help="simulated nodes (1 or 2)")
    p.add_argument("--gpus", type=int, default=4, help="fake cards per node")
    p.add_argument("--containerd", default="auto", help="auto (real containers when root) or none")
    p.add_argument("--containerd-api", choices=("cri", "ctr"), default="cri",
                   help="how the nodes run containers in containerd: its CRI plugin, as a kubelet (default), "
                        "or ctr run with an OCI spec of their own")
    p.add_argument("--dir", type=Path, default=None, help="run directory (default: a new one in /tmp)")
    p.add_argument("--keep-logs", action="store_true", help="keep the run directory and its logs")
    p.add_argument("--nats-cluster", type=int, default=1, metavar="N",
                   help="NATS servers: 1, or 3 (a cluster; the stream and buckets at 3 replicas)")
    p.add_argument("--no-nats-auth", action="store_true",
                   help="an open NATS server without the auth callout (debugging only)")
    a = p.parse_args(argv)
    if a.scenario not in ("all", "none", *SCENARIOS):
        p.error(f"unknown scenario {a.scenario!r}: all, none or one of {', '.join(SCENARIOS)}")
    if not 1 <= a.nodes <= 4:
        p.error("--nodes must be between 1 and 4")
    if a.nats_cluster not in (1, 3, 5):
        p.error("--nats-cluster must be 1, 3 or 5 (a cluster needs an odd number of servers)")
    return a


async def run(args: argparse.Namespace, timeline: Timeline) -> int:
    settings = ClusterSettings(nodes=args.nodes, gpus=args.gpus, containerd=args.containerd,
                               containerd_api=args.containerd_api,
                               run_dir=args.dir, keep_dir=args.keep_logs or args.dir is not None,
                               nats_servers=args.nats_cluster, nats_auth=not args.no_nats_auth)  # fmt: skip
    names = list(SCENARIOS) if args.scenario == "all" else [] if args.scenario == "none" else [args.scenario]
    async with Cluster(settings, timeline) as cluster:
        ok = await play(cluster, timeline, names)
        if names:
            print("\n" + timeline.summary(), flush=True)
        if args.keep:
            timeline.step("--keep: everything stays up; Ctrl-C stops it.")
            timeline.step(f"  kubectl --kubeconfig {cluster.kubeconfig} get pods -A   (API {cluster.api_url})")
            if cluster.console_url:
                timeline.step(f"  console (the cluster view): {cluster.console_url}")
            timeline.step("Status endpoints:")
            for name, url in cluster.status_endpoints().items():
                timeline.step(f"  {name:28} {url}")
            await asyncio.Event().wait()
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gslog.setup("ERROR")  # the story is the timeline; each part logs to its own file
    timeline = Timeline()

    async def guarded() -> int:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            return await run(args, timeline)
        except asyncio.CancelledError:
            timeline.step("interrupted: everything was stopped")
            return 130

    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(guarded())
    return 130


if __name__ == "__main__":
    sys.exit(main())
