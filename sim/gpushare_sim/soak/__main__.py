"""``python -m gpushare_sim.soak --minutes M --seed S [--nodes K] [--nats-cluster 3]``: a chaos soak
(``--profile NAME [--borrowers slow]``: one of :mod:`.profiles`, the README's runs).

Runs the local cluster with every real service and, for M minutes, a random but reproducible
schedule (the seed): dev machines that go away and come back with a borrower on their card
(half of the borrowers slow to die: GiBs of memory, many threads, a child in another
session), SharePods that come and go, and faults (a service killed with SIGKILL and started
again, nats-server restarted or one server of a cluster killed, the kubelet's socket
re-created, the API emulator restarted, the CPU saturated). The invariants of
:mod:`gpushare_sim.soak.checks` are checked while it runs; the end prints one table. A
violation prints the seed and the timeline, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import signal
import sys
import time
import traceback
from contextlib import AsyncExitStack

from gpushare_common import logging as gslog
from gpushare_common.adapters.kube import KubeError

from gpushare_sim.run.cluster import Cluster, ClusterSettings
from gpushare_sim.run.evidence import keep_evidence
from gpushare_sim.run.kubeapi import ensure_namespace
from gpushare_sim.run.narrate import Timeline
from gpushare_sim.scenarios.kit import Scenario, open_clients, phase, recording
from gpushare_sim.soak.actors import Soak, fault_schedule, owner_cycles, share_churn
from gpushare_sim.soak.checks import NODE_FAULTS, Checks
from gpushare_sim.soak.faults import KINDS, Faults
from gpushare_sim.soak.profiles import BORROWERS, PROFILES, defaults
from gpushare_sim.soak.report import progress, table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m gpushare_sim.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", choices=sorted(PROFILES), help="a named run: its options become the defaults")
    p.add_argument("--borrowers", choices=sorted(BORROWERS), default="ordinary", help="with --profile")
    p.add_argument("--label", default="", help="named in the table (a profile names itself)")
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--nats-cluster", type=int, default=1, metavar="N", help="1, or 3 servers")
    p.add_argument("--faults", default=",".join(KINDS), help=f"fault kinds (of {', '.join(KINDS)})")
    p.add_argument("--fault-every", type=float, default=20.0, help="seconds between faults, on average")
    p.add_argument("--fault-schedule", choices=("random", "regular"), default="random",
                   help="random: exponential gaps of --fault-every on average; regular: exactly that gap")
    p.add_argument("--recovery-bound", type=float, default=60.0, help="seconds a fault may take to heal")
    p.add_argument("--slow-share", type=float, default=0.5, help="share of borrowers slow to die")
    p.add_argument("--borrower-mib", type=int, default=1024, help="memory of a slow borrower")
    p.add_argument("--keep-logs", action="store_true", help="keep the run directory (logs) afterwards")
    p.add_argument("--containerd-api", choices=("cri", "ctr"), default="cri",
                   help="containers through containerd's CRI plugin, as a kubelet (default), or ctr run")
    chosen, _ = p.parse_known_args(argv)
    if chosen.profile:
        p.set_defaults(**defaults(chosen.profile, chosen.borrowers))
    a = p.parse_args(argv)
    a.faults = tuple(k for k in a.faults.split(",") if k)
    if unknown := [k for k in a.faults if k not in KINDS]:
        p.error(f"unknown fault kinds {unknown}: choose from {', '.join(KINDS)}")
    if not 1 <= a.nodes <= 4 or a.nats_cluster not in (1, 3, 5) or a.minutes <= 0:
        p.error("--nodes 1..4, --nats-cluster 1, 3 or 5, --minutes > 0")
    a.seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1, 2**31)
    return a


async def soak(args: argparse.Namespace, timeline: Timeline) -> int:
    rng = random.Random(args.seed)
    settings = ClusterSettings(nodes=args.nodes, nats_servers=args.nats_cluster, keep_dir=args.keep_logs,
                               containerd_api=args.containerd_api,
                               evidence=f"soak-{args.seed}")  # an error or an interruption keeps the logs too
    async with Cluster(settings, timeline) as cluster, AsyncExitStack() as stack:
        kube, bus = await open_clients(cluster, stack)
        s = Scenario("soak", cluster, timeline, kube, bus)
        await asyncio.to_thread(ensure_namespace, cluster.kubeconfig, s.namespace)
        checks = Checks(cluster, expect_release=not set(args.faults) & NODE_FAULTS)
        run = Soak(s, checks, rng, time.monotonic() + args.minutes * 60, args.slow_share, args.borrower_mib)
        async with recording(s):
            await play(run, Faults(cluster), args)
        if args.minutes >= 1 and run.checks.owner_backs == 0 and cluster.nodes:
            run.checks.fail("coverage", f"no owner-back was exercised in {args.minutes:g} min: the owners' "
                                        "cycles never lent a card and came back (see the timeline)")
        if run.checks.violations:
            keep_evidence(cluster.run_dir / "logs", f"soak-{args.seed}")
        print(table(args, run), flush=True)
    return report_violations(args, run, timeline)


async def play(run: Soak, faults: Faults, args: argparse.Namespace) -> None:
    rngs = [random.Random(run.rng.random()) for _ in range(len(run.s.cluster.nodes) + 2)]
    actors = [asyncio.ensure_future(owner_cycles(run, node.name, rngs[i]))
              for i, node in enumerate(run.s.cluster.nodes)]  # fmt: skip
    actors.append(asyncio.ensure_future(share_churn(run, rngs[-2])))
    if args.faults:
        actors.append(asyncio.ensure_future(fault_schedule(run, faults, rngs[-1], args.fault_every,
                                                           args.recovery_bound, args.faults,
                                                           args.fault_schedule == "regular")))  # fmt: skip
    watcher = asyncio.ensure_future(watch(run))
    try:
        done, _ = await asyncio.wait(actors, timeout=args.minutes * 60 + 240)
        for task in done:
            if task.exception() is not None:
                run.checks.fail("soak", f"an actor failed: {task.exception()!r}")
    finally:
        for task in (*actors, watcher):
            task.cancel()
        await asyncio.gather(*actors, watcher, return_exceptions=True)
    await faults.ready()
    await check_once(run)


async def watch(run: Soak, every_s: float = 2.0) -> None:
    """Check the invariants every few seconds; a progress line every 30 s."""
    last = time.monotonic()
    while True:
        await asyncio.sleep(every_s)
        await check_once(run)
        if time.monotonic() - last >= 30:
            last = time.monotonic()
            print(progress(run), flush=True)


async def check_once(run: Soak, share_bound_s: float = 90.0) -> None:
    for name, child in run.s.cluster.children.items():  # a part the faults did not stop has died
        if child.proc is not None and not child.stopping and child.proc.poll() is not None \
                and (name, child.starts) not in run.checks.deaths:
            run.checks.deaths.add((name, child.starts))
            run.checks.fail("recovery", f"{name} exited by itself with status {child.proc.returncode}: "
                                        f"{child.tail(3)[-300:]}")  # fmt: skip
    for record in run.s.evictions[run.checks.records_seen:]:
        run.checks.on_record(record)
    run.checks.records_seen = len(run.s.evictions)
    with contextlib.suppress(OSError):
        await run.checks.poll()
    with contextlib.suppress(KubeError):
        running = {p["metadata"]["name"] for p in await run.s.pods() if phase(p) == "Running"}
        run.checks.running_in_time(run.sharing, running, share_bound_s)


def report_violations(args: argparse.Namespace, run: Soak, timeline: Timeline) -> int:
    if not run.checks.violations:
        print(f"soak passed: seed {args.seed}, {args.minutes:g} min, 0 violations", flush=True)
        return 0
    print(f"\nSOAK FAILED: {len(run.checks.violations)} violation(s). Replay with "
          f"python -m gpushare_sim.soak --seed {args.seed} --minutes {args.minutes:g} --nodes {args.nodes} "
          f"--nats-cluster {args.nats_cluster}", flush=True)  # fmt: skip
    for violation in run.checks.violations:
        print(f"  [{violation.at:8.1f}s] {violation.invariant}: {violation.detail}")
    print("\n--- timeline ---\n" + "\n".join(timeline.lines), flush=True)
    return 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gslog.setup("ERROR")
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # the API restarting is part of the plan
    print(f"soak: {args.label + ', ' if args.label else ''}seed {args.seed}, {args.minutes:g} min, {args.nodes} "
          f"node(s), {args.nats_cluster} NATS server(s), faults {','.join(args.faults) or 'none'}",
          flush=True)  # fmt: skip
    timeline = Timeline(out=None)

    async def guarded() -> int:
        task = asyncio.current_task()
        assert task is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, task.cancel)
        try:
            return await soak(args, timeline)
        except asyncio.CancelledError:
            print(f"interrupted (seed {args.seed})", flush=True)
            return 130
        except Exception:  # the soak's top: any failure is reported with its seed and timeline
            print(f"\nSOAK FAILED with an error (seed {args.seed}):\n{traceback.format_exc()}"
                  "\n--- timeline ---\n" + "\n".join(timeline.lines), flush=True)
            return 1

    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(guarded())
    return 130


if __name__ == "__main__":
    sys.exit(main())
