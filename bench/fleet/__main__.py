"""Large clusters: 1,000 emulated GPU nodes on a 3-server NATS cluster beside one real node.

  python -m bench.fleet [--nodes 1000] [--steps 100,300,1000] [--window 30] [--trials 40]
                        [--rounds 2] [--kills 3] [--workers 1] [--layout cluster|leaf] [--results PATH]

``--layout leaf`` (the shipped layout) gives every node, the real one and each emulated one,
its own leaf server connected to the cluster (:mod:`bench.fleet.leaves`): the node's stream,
buckets and traffic stay there, and the rows measure what is left on the cluster's servers
(the leaf connections) beside what the leaves cost (the nodes' own work); the kills are of
each cluster server in turn. ``--layout cluster`` is the layout before: every node's
connections, stream and buckets on the cluster (what follows describes it).

Three nats-server processes (routes on loopback, HTTP monitoring on) get the
installer's layout (``Bus.ensure_layout()``: the ``GPUSHARE`` stream and the
four buckets at 3 replicas). One *real* node runs the owner-back path end to
end on them (:mod:`bench.fleet.owner`: the solver with a private containerd
and real runc borrowers, the kmod-bridge, the kernel stand-in). Then the fleet
joins, step by step: every emulated node has the four connections, the
subscriptions, the durable consumer and the key-value writes of a real node,
at the real rates (:mod:`bench.fleet.emulator`), from ``--workers`` processes
of :mod:`bench.fleet.worker` speaking the NATS protocol directly
(:mod:`bench.fleet.wire`); no two nodes share a connection.

Per node, steady state, the periods read from the code (:mod:`bench.fleet.model`):

- solver: a fetch of one message with a 0.5 s expiry, again as soon as it is
  answered (``Bus.consume``, batch 1): 2 pull requests/s, each answered by the
  consumer's leader (a 408 when nothing came); per event a journal write, and
  for a pod's fact the mapping, the plan (put and delete) and the desired
  health (bucket and core subject); an event id already seen is only acked;
- detector: every ``resync_s`` (60 s) every fact again, 13 on the profiled
  node, with their stable ids (the stream drops those of its 120 s
  duplicate window, so about half are stored and delivered) and the kmod watch
  set; vcpu and vmem every ``capacity_s`` (30 s: the profile assumes a busy
  node whose use moves each sample; a quiet one publishes every 300 s); a
  kmod ``stats`` request every ``scrape_s`` (15 s); the card inventory every
  ``inventory_s`` only when it changed (never here);
- device plugin: one direct get per plugin (9) every ``resync_s`` (60 s);
- kmod-bridge: answers the detector; writes a watch entry per new container;
- workload (not in the code): 12 pod changes per node an hour, each a new fact
  (JetStream), its save, a kmod add and a watch entry;
- nats-py's keep-alive PING every 5 s on each of the 4 connections.

That is about 3.3 messages/s a node, 2 of them fetches. The short-lived
consumers of the key-value listings a service makes when it starts are left
out (``--startup-scans`` adds them), and so are retries.

Measured: the servers' CPU (``/proc``, user + system) and resident memory,
per server and in total, at each step and per 100 nodes; the streams,
consumers and raft groups the layout creates per node (the servers' ``/jsz``);
the emulator's own CPU and clock lag (was it, not the servers, the
bottleneck?). Then at full size the real node's owner-back latency (how long
the owner's call is held) in alternating phases with the fleet running and
paused (its connections and consumers stay); target p99 running <= 2x paused.
Last, ``--kills`` times: the stream's leader is SIGKILLed just before the
owner's call, owner-backs run while it is down, and it is restarted with its
store.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from collections import Counter
from pathlib import Path

from gpushare_common import logging
from gpushare_common.bus import Bus
from gpushare_common.layout import Layout

from bench.fleet import rows
from bench.fleet.fleet import Fleet
from bench.fleet.leaves import Leaves
from bench.fleet.model import FETCH_TIMEOUT_S, Profile
from bench.fleet.owner import RealNode, real_node
from bench.fleet.phases import alternate, failover, series, window
from bench.fleet.servers import NatsCluster
from bench.report import RESULTS, Row, save, stamp, table
from bench.solver.node import NODE

JOIN_WAIT_S = 45.0  # the longest a step waits for its nodes' durable consumers


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=1000, help="emulated GPU nodes at full size")
    p.add_argument("--steps", default="", help="comma-separated fleet sizes (default: 10%%, 30%%, 100%%)")
    p.add_argument("--window", type=float, default=20.0, help="seconds of measuring at each step")
    p.add_argument("--settle", type=float, default=10.0, help="seconds after a step before measuring")
    p.add_argument("--rate", type=float, default=50.0, help="nodes joining per second")
    p.add_argument("--trials", type=int, default=40, help="owner-back trials per phase")
    p.add_argument("--phase-s", type=float, default=30.0, help="longest a phase of trials may take")
    p.add_argument("--rounds", type=int, default=2, help="running/paused rounds")
    p.add_argument("--kills", type=int, default=2, help="stream leader kills")
    p.add_argument("--down", type=float, default=8.0, help="seconds a killed server stays down")
    p.add_argument("--borrowers", type=int, default=2, help="borrowers per owner-back")
    p.add_argument("--workers", type=int, default=1, help="fleet emulator processes")
    p.add_argument("--startup-scans", action="store_true", help="emulate the listings of a service start")
    p.add_argument("--fetch-expires", type=float, default=FETCH_TIMEOUT_S,
                   help="the solvers' fetch expiry in seconds (the code's by default)")
    p.add_argument("--layout", choices=("leaf", "cluster"), default="leaf",
                   help="leaf: a leaf server per node (shipped); cluster: every node on the cluster (before)")
    p.add_argument("--results", type=Path, default=RESULTS, help="where the rows are merged")
    args = p.parse_args(argv)
    args.steps = sorted({int(s) for s in args.steps.split(",") if s.strip()} or
                        {max(1, args.nodes // 10), max(1, args.nodes * 3 // 10), args.nodes})
    return args


async def consumer_cap(cluster: NatsCluster, layout: Layout, wanted: int) -> list[Row]:
    """How many durable consumers the stream accepts as installed; raised when too few."""
    bus = Bus(cluster.settings(), "installer")
    await bus.connect()
    try:
        js = bus.client.jetstream()
        config = (await js.stream_info(layout.stream)).config
        server = int(cluster.monitor(next(iter(cluster.members)), "/jsz").get("limits", {})
                     .get("default_max_consumers", -1))  # fmt: skip
        own = config.max_consumers or -1
        accepted = own if own > 0 else server
        lift = 0 <= accepted < wanted
        if lift:
            config.max_consumers = wanted * 2
            await js.update_stream(config)
        return rows.cap_rows(accepted, wanted, lift)
    finally:
        await bus.drain()


async def measure(args: argparse.Namespace, work: Path) -> list[Row]:
    cluster, layout = NatsCluster(work), Layout()
    leaves = Leaves(work, cluster) if args.layout == "leaf" else None
    cluster.start()
    try:
        cluster.wait_healthy()
        profile = Profile(startup_scans=args.startup_scans, fetch_expires_s=args.fetch_expires)
        leafy = float(args.layout == "leaf")
        found = [*rows.model_rows(profile), rows.row("layout: 1 = a leaf server per node, 0 = all on the cluster",
                                                     leafy, "")]  # fmt: skip
        if leaves is None:
            await cluster.install(cluster.settings())
            found += await consumer_cap(cluster, layout, args.nodes + 1)
        target = (await leaves.grow([NODE]))[0] if leaves is not None else cluster
        async with real_node(target, layout, work, args.borrowers) as node:
            fleet = Fleet(cluster.addresses, layout, profile, args.workers, work)
            await fleet.start()
            try:
                found += await _phases(args, cluster, layout, fleet, node, profile, leaves)
            finally:
                await fleet.stop()
        return found
    finally:
        if leaves is not None:
            leaves.stop()
        cluster.stop()


async def _phases(args: argparse.Namespace, cluster: NatsCluster, layout: Layout, fleet: Fleet, node: RealNode,
                  profile: Profile, leaves: Leaves | None) -> list[Row]:  # fmt: skip
    say = _say
    base = await window(cluster, fleet, min(args.window, 10.0))
    say(f"no fleet: servers {base.cpu:.2f} cores; {args.trials} owner-backs")
    pristine = await series(node, args.trials, args.phase_s)
    steps = []
    leaf_rows: list[Row] = []
    for size in args.steps:
        own = None if leaves is None else \
            [leaf.address for leaf in await leaves.grow([f"fleet-{i:05d}" for i in range(size)])]
        grown = await fleet.grow(size, args.rate, timeout=JOIN_WAIT_S, servers=own)
        await asyncio.sleep(args.settle)
        leaf_cpu = leaves.cpu_s() if leaves is not None else 0.0
        steps.append((await window(cluster, fleet, args.window), grown))
        if leaves is not None:
            leaf_rows += rows.leaf_rows(size, (leaves.cpu_s() - leaf_cpu) / steps[-1][0].seconds, leaves.rss(),
                                        len(leaves.started))  # fmt: skip
        step = steps[-1][0]
        say(f"{size} nodes: joined in {grown:.0f} s ({step.ready} with their consumer), servers {step.cpu:.2f} "
            f"cores, emulator {step.fleet_cpu:.2f} cores, machine load {step.load:.1f}")
        for error, count in step.errors.most_common(3):
            say(f"  fleet errors in the window ({count}x): {error}")
    await fleet.pause()
    await asyncio.sleep(2.0)
    idle = await window(cluster, fleet, min(args.window, 10.0))
    say(f"owner-backs: {args.rounds} rounds of {args.trials} with the fleet running, then paused")
    phases = await alternate(node, fleet, args.rounds, args.trials, args.phase_s)
    say(f"failovers: {args.kills} kills of the stream leader")
    lost = await failover(node, fleet, cluster, layout.stream, args.kills, args.down, leaves is not None)
    for error, count in Counter(r.error for r in [*lost.at_kill, *lost.while_down] if r.error).items():
        say(f"failed during the failovers ({count}x): {error}")
    after = await window(cluster, fleet, 5.0)
    found = rows.step_rows(base, steps, profile) + leaf_rows + rows.idle_rows(base, idle)
    found += rows.emulator_rows(steps[-1][0], args.workers, profile)
    found += rows.owner_rows(pristine, phases, args.steps[-1]) + rows.failover_rows(lost)
    found.append(rows.row("after the failovers: fetches per node", after.sent.get("pull", 0.0) / max(1, after.nodes),
                          "/s"))  # fmt: skip
    return found


def _say(text: str) -> None:
    print(f"    {text}", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    with (work / "bench.log").open("a") as log:
        logging.setup("WARNING", stream=log)  # its own clients' reconnects go there, not to the table
        try:
            found = asyncio.run(measure(args, work))
        except BaseException:
            print(f"bench.fleet failed; logs kept in {work}", flush=True)
            raise
    shutil.rmtree(work, ignore_errors=True)
    print(table(found), flush=True)
    print(stamp(), flush=True)
    save(found, args.results)


if __name__ == "__main__":
    main()
