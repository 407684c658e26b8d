"""The faults the soak injects into a running local cluster, and how long each takes to heal.

Each fault is one kind (``kill``, ``nats``, ``nats-member``, ``nats-outage``, ``leaf``,
``apiserver``, ``kubelet``, ``cpu``) and a target; :meth:`Faults.inject` does it the way it
happens on a cluster (a process killed with SIGKILL and started again by its supervisor a
moment later, a server restarted, every server of the NATS cluster down for a while, a node's
leaf server killed, the kubelet's socket re-created, the node's CPU saturated) and returns
once every service answers ``/readyz`` again, with the time that took.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time
from dataclasses import dataclass

from gpushare_sim.run.cluster import Cluster
from gpushare_sim.run.lifeline import owned
from gpushare_sim.run.procs import http_json

NODE_SERVICES = ("detector", "solver", "deviceplugin", "kmod-bridge")
KINDS = ("kill", "nats", "nats-member", "nats-outage", "leaf", "apiserver", "kubelet", "cpu")
OUTAGE_S = 30.0  # every server of the NATS cluster down for this long (``nats-outage``)


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    target: str  # a child's name, a node, or "" for the whole cluster
    hold_s: float = 0.0  # how long it lasts (down time before the restart, CPU burn)

    def __str__(self) -> str:
        return f"{self.kind}:{self.target}" if self.target else self.kind


def choose(rng: random.Random, cluster: Cluster, kinds: tuple[str, ...] = KINDS) -> Fault:
    """One fault, from the seeded ``rng`` only (the same seed chooses the same faults)."""
    kind = rng.choice([k for k in kinds if k != "nats-member" or len(cluster.nats) > 1])
    node = rng.choice(cluster.nodes).name
    if kind == "kill":
        target = rng.choice([*(f"{s}@{node}" for s in NODE_SERVICES), "shadow-controller"])
        return Fault(kind, target, rng.uniform(0.2, 2.0))
    if kind == "nats-member":
        return Fault(kind, rng.choice(cluster.nats).name, rng.uniform(1.0, 5.0))
    if kind == "nats-outage":
        return Fault(kind, "", OUTAGE_S)
    if kind == "leaf":
        return Fault(kind, cluster.leaf(node).child, rng.uniform(0.2, 2.0))
    if kind == "cpu":
        return Fault(kind, node, rng.uniform(5.0, 20.0))
    return Fault(kind, node if kind == "kubelet" else "", rng.uniform(0.0, 1.0))


class Faults:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def inject(self, fault: Fault) -> float:
        """Do ``fault``; the seconds from its start until every service is ready again."""
        started = time.monotonic()
        match fault.kind:
            case "kill":
                await self._kill_and_start(fault.target, fault.hold_s, signal.SIGKILL)
            case "nats":
                await self.cluster.restart(self.cluster.nats[0].name)
            case "nats-member" | "leaf":
                await self._kill_and_start(fault.target, fault.hold_s, signal.SIGKILL)
            case "nats-outage":
                await self._outage(fault.hold_s)
            case "apiserver":
                await self.cluster.restart("apiserver")
            case "kubelet":
                url = f"{self.cluster.child(f'node@{fault.target}').http}/kubelet/restart"
                await asyncio.to_thread(http_json, url, 5.0, "POST")
            case "cpu":
                await burn(os.cpu_count() or 2, fault.hold_s)
            case _:
                raise ValueError(f"unknown fault {fault}")
        await self.ready()
        return time.monotonic() - started

    async def _kill_and_start(self, name: str, down_s: float, sig: signal.Signals) -> None:
        child = self.cluster.child(name)
        await asyncio.to_thread(child.kill, sig)
        await asyncio.sleep(down_s)  # a supervisor's restart delay
        child.start()
        await self.cluster.started(child)

    async def _outage(self, down_s: float) -> None:
        """Every server of the NATS cluster killed, all started again ``down_s`` later."""
        members = [self.cluster.child(m.name) for m in self.cluster.nats]
        for child in members:
            await asyncio.to_thread(child.kill, signal.SIGKILL)
        await asyncio.sleep(down_s)
        for child in members:
            child.start()
        for child in members:
            await self.cluster.started(child)

    async def ready(self, timeout: float = 120.0) -> None:
        """Every service answers its readiness endpoint (the shadow-controller its liveness)."""
        for name, child in self.cluster.children.items():
            if child.http:
                await child.wait_ready("/healthz" if name == "shadow-controller" else "/readyz", timeout)


async def burn(processes: int, seconds: float) -> None:
    """Saturate the CPU with ``processes`` busy loops for ``seconds``."""
    loop = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\nwhile time.monotonic() < end: pass"
    procs = [await asyncio.create_subprocess_exec(*owned([sys.executable, "-c", loop, str(seconds)]))
             for _ in range(processes)]  # fmt: skip
    try:
        await asyncio.gather(*(p.wait() for p in procs))
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
