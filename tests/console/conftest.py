"""One local cluster (five fake cards, the console among its processes) and one headless Chromium,
shared by the module's tests; the cluster is populated once (:func:`tests.console.scene.populate`)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack

import pytest
import pytest_asyncio
from gpushare_sim.run.cluster import Cluster, ClusterSettings
from gpushare_sim.run.kubeapi import ensure_namespace
from gpushare_sim.run.narrate import Timeline
from gpushare_sim.scenarios.kit import Scenario, open_clients, recording

from tests.console.cdp import Browser, chromium_binary
from tests.console.scene import GPUS, Scene, populate, populate_dra
from tests.e2e.conftest import needs
from tests.support import procs, threads


def _allow(cluster: Cluster, browser: Browser | None = None) -> None:
    for child in cluster.children.values():
        if child.pid:
            procs.allow(child.pid)
    if browser is not None:
        procs.allow(browser.proc.pid)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def scene() -> AsyncIterator[Scene]:
    needs()
    binary = chromium_binary()
    if binary is None:
        pytest.fail("chromium is not installed: run `make deps` (Debian package chromium)")
    started = threads.snapshot()
    timeline = Timeline(out=sys.stdout)
    async with Cluster(ClusterSettings(nodes=1, gpus=GPUS), timeline) as cluster, AsyncExitStack() as stack:
        kube, bus = await open_clients(cluster, stack)
        s = Scenario("console", cluster, timeline, kube, bus)
        await asyncio.to_thread(ensure_namespace, cluster.kubeconfig, s.namespace)
        browser = await asyncio.to_thread(Browser, binary)
        stack.callback(browser.close)
        _allow(cluster, browser)
        async with recording(s):
            yield await populate(s, browser)
    for pid in procs.children():
        procs.disallow(pid)
    threads.assert_none_left(started, "the module's cluster")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dra_node(scene: Scene) -> str:
    """A DRA node joined to the scene's cluster, for the tests that ask for it (its name)."""
    try:
        return await populate_dra(scene.s)
    finally:
        _allow(scene.s.cluster)


@pytest.fixture(autouse=True)
def cluster_children(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "scene" in request.fixturenames:
        found: Scene = request.getfixturevalue("scene")
        _allow(found.s.cluster, found.browser)
