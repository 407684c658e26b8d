"""The overselling scenario on the whole local cluster: memory pressure evicts oversold data tasks in order."""

from __future__ import annotations

import pytest
from gpushare_sim.scenarios import oversell  # noqa: F401  (registers the scenario)

from tests.e2e.conftest import E2E

pytestmark = [pytest.mark.slow, pytest.mark.containerd, pytest.mark.asyncio(loop_scope="module")]


async def test_memory_pressure_evicts_lowest_priority_then_newest_and_stops_under_the_threshold(e2e: E2E) -> None:
    detail = await e2e.run("oversell")
    assert "data-3 then data-1 evicted" in detail and "data-2 kept" in detail
    hops = e2e.timeline.hops_of("oversell")
    assert hops["memory at 80% -> 2 data tasks evicted and gone"] < 30
    assert any("node memory use raised to 80% through the simulated cgroup tree" in line
               for line in e2e.timeline.lines)
