"""The nodes' own NATS for ``--layout leaf``: one leaf server per node, connected to the cluster.

Each node (the real one and every emulated one) gets a nats-server leaf with its own JetStream
domain, configured by the code the leaf's pod runs in Kubernetes (``gpushare-nats-leaf``, here
through :class:`gpushare_sim.run.leaves.NodeNats`, open: the benchmark measures load, not
authentication), and the node's stream and buckets made on it by the installer. The node's
services, real or emulated, use only their leaf; the cluster carries what crosses (nothing in
this benchmark: no observer) and the leaf connections themselves. What the leaves cost is
measured apart: it is the nodes' own work, on the nodes' own machines in a real cluster.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

from gpushare_common.bus.install import install
from gpushare_common.ports import port_of
from gpushare_common.settings import NatsSettings
from gpushare_sim import natsd
from gpushare_sim.run.leaves import NodeNats
from gpushare_sim.run.lifeline import owned
from gpushare_sim.run.procs import wait_ports

from bench.fleet.servers import NatsCluster, proc_cpu_s, proc_rss

INSTALLS_AT_ONCE = 8


class Leaf:
    """One node's leaf server, as a NATS target of the real node (``url``, ``settings``)."""

    def __init__(self, nats: NodeNats, proc: subprocess.Popen[bytes]) -> None:
        self.nats, self.proc = nats, proc

    @property
    def url(self) -> str:
        return self.nats.url

    @property
    def address(self) -> str:
        return self.url.removeprefix("nats://")

    def settings(self, **overrides: Any) -> NatsSettings:
        return NatsSettings(url=self.url, stream_replicas=1, reconnect_wait_s=0.2, **overrides)


class Leaves:
    def __init__(self, work: Path, cluster: NatsCluster) -> None:
        self.work, self.cluster = work / "leaves", cluster
        self.started: dict[str, Leaf] = {}

    def _start(self, node: str) -> Leaf:
        hubs = tuple(m.leaf_port for m in self.cluster.members.values())
        nats = NodeNats.make(node, natsd.ANY_PORT, self.work, hubs, auth=False, ports_dir=self.work / "ports")
        config = nats.write("")
        log = (self.work / f"{node}.log").open("ab")
        proc = subprocess.Popen(owned([natsd.server_binary(), "-c", str(config)]), stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL)  # fmt: skip
        log.close()
        nats.client_port = port_of(wait_ports(self.work / "ports", proc)["nats"][0])
        return Leaf(nats, proc)

    async def grow(self, nodes: list[str]) -> list[Leaf]:
        """A leaf for each of ``nodes`` not started yet, its node's layout made; all of theirs."""
        fresh = [n for n in nodes if n not in self.started]
        for node in fresh:
            self.started[node] = await asyncio.to_thread(self._start, node)
        gate = asyncio.Semaphore(INSTALLS_AT_ONCE)

        async def layout(node: str) -> None:
            async with gate:
                await install(self.started[node].settings(), deadline_s=60, node=node)

        await asyncio.gather(*(layout(n) for n in fresh))
        return [self.started[n] for n in nodes]

    def cpu_s(self) -> float:
        return sum(proc_cpu_s(leaf.proc.pid) for leaf in self.started.values())

    def rss(self) -> int:
        return sum(proc_rss(leaf.proc.pid) for leaf in self.started.values())

    def stop(self) -> None:
        for leaf in self.started.values():
            if leaf.proc.poll() is None:
                leaf.proc.terminate()
        for leaf in self.started.values():
            try:
                leaf.proc.wait(10)
            except subprocess.TimeoutExpired:
                leaf.proc.kill()
                leaf.proc.wait()
