"""One local cluster (every service as its own process) shared by the module's scenarios."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass

import pytest
import pytest_asyncio
from gpushare_common.bus import Bus
from gpushare_sim.node.adapters.backend import containerd_usable
from gpushare_sim.node.adapters.kube import SimKube
from gpushare_sim.run.cluster import Cluster, ClusterSettings
from gpushare_sim.run.evidence import keep_evidence
from gpushare_sim.run.narrate import Timeline
from gpushare_sim.scenarios.kit import Scenario, open_clients, run_scenario

from tests.support import procs, threads


@dataclass
class E2E:
    cluster: Cluster
    timeline: Timeline
    kube: SimKube
    bus: Bus

    def scenario(self, name: str) -> Scenario:
        return Scenario(name, self.cluster, self.timeline, self.kube, self.bus)

    async def run(self, name: str) -> str:
        try:
            return await run_scenario(self.scenario(name))
        except BaseException:
            keep_evidence(self.cluster.run_dir / "logs", f"e2e-{name}")  # a failure seen once stays readable
            raise

    def allow_children(self) -> None:
        """The cluster's processes live across tests (restarted ones get new pids)."""
        for child in self.cluster.children.values():
            if child.pid:
                procs.allow(child.pid)


def needs() -> None:
    missing = [b for b in ("nats-server", "gcc") if shutil.which(b) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (make deps installs them)")
    if not containerd_usable():
        pytest.skip("needs root, containerd, ctr, runc and busybox for real containers")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def e2e() -> AsyncIterator[E2E]:
    needs()
    started = threads.snapshot()
    timeline = Timeline(out=sys.stdout)
    keep = bool(os.environ.get("GPUSHARE_E2E_KEEP_LOGS"))  # leave the run directory for a post-mortem
    async with Cluster(ClusterSettings(nodes=1, keep_dir=keep), timeline) as cluster, AsyncExitStack() as stack:
        kube, bus = await open_clients(cluster, stack)
        env = E2E(cluster, timeline, kube, bus)
        env.allow_children()
        yield env
    for pid in procs.children():
        procs.disallow(pid)
    threads.assert_none_left(started, "the module's cluster")


@pytest.fixture(autouse=True)
def cluster_children(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "e2e" in request.fixturenames:
        request.getfixturevalue("e2e").allow_children()
