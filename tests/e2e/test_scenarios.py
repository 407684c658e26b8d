"""The end-to-end scenarios on one shared local cluster (real processes, containers, NATS)."""

from __future__ import annotations

import time

import pytest
from gpushare_sim.scenarios import oversell  # noqa: F401  (registers the scenario)

from tests.e2e.conftest import E2E

pytestmark = [pytest.mark.slow, pytest.mark.containerd, pytest.mark.asyncio(loop_scope="module")]


async def test_dind_main_and_dind_see_the_same_card(e2e: E2E) -> None:
    assert "both see gpu-node-1/nvidia" in await e2e.run("dind")


async def test_sharegpu_shadowpods_sharers_eviction_and_retirement(e2e: E2E) -> None:
    detail = await e2e.run("sharegpu")
    assert "1 ShadowPod for 4 SharePods" in detail


async def test_caps_every_capped_sharepod_sees_its_caps_and_the_soft_share_none(e2e: E2E) -> None:
    started = time.monotonic()
    detail = await e2e.run("caps")
    assert time.monotonic() - started < 30  # clean-up of its pods and ShadowPods included
    assert "4 capped SharePods on 2 share kinds see card memory * k / N" in detail
    assert any("dev-two: 2 of share-dev-gpu-4" in line and "GPUSHARE_SIM_MEMORY_LIMIT_MIB=8192" in line
               for line in e2e.timeline.lines)


async def test_spot_steal_owner_back_evicts_the_borrower_and_releases_the_owner(e2e: E2E) -> None:
    await e2e.run("spot")
    hops = e2e.timeline.hops_of("spot")
    returned = hops["owner ioctl -> owner's call returns (kernel released it)"]
    dead = hops["owner ioctl -> borrower's tasks dead (containerd kill)"]
    assert returned >= dead - 0.05 and returned < 10


async def test_bad_annotations_fail_clearly_and_malformed_events_are_counted(e2e: E2E) -> None:
    detail = await e2e.run("badinput")
    assert "3 bad pods failed clearly" in detail
    assert any("signature-ids.main is missing" in line for line in e2e.timeline.lines)


async def test_faults_restarts_lose_and_repeat_no_eviction(e2e: E2E) -> None:
    await e2e.run("faults")
    hops = e2e.timeline.hops_of("faults")
    assert any(hop.startswith("kubelet restart -> all ") for hop in hops)
    assert e2e.cluster.child("nats-server").starts == 3
    assert e2e.cluster.child(e2e.cluster.leaf().child).starts == 3  # the node's own NATS, its state on its disk


async def test_dra_shares_spot_and_a_device_plugin_node_side_by_side(e2e: E2E) -> None:
    detail = await e2e.run("dra")
    assert "4 x 25 shares on" in detail and "tainted, then lent again" in detail
    assert "the MPS daemon up from before the first to after the last" in detail
    assert "gpushare/share-gpu-4 served on both nodes, each pair on one card" in detail
    hops = e2e.timeline.hops_of("dra")
    returned = hops["owner ioctl -> owner's call returns (kernel released it)"]
    dead = hops["owner ioctl -> borrower's tasks dead (containerd kill)"]
    assert returned >= dead - 0.05 and returned < 10
    assert any(node.dra for node in e2e.cluster.nodes)


async def test_memory_pressure_evicts_lowest_priority_then_newest_and_stops_under_the_threshold(e2e: E2E) -> None:
    """Oversold CPU-only data tasks: memory pressure evicts them in order (the overselling scenario)."""
    detail = await e2e.run("oversell")
    assert "data-3 then data-1 evicted" in detail and "data-2 kept" in detail
    hops = e2e.timeline.hops_of("oversell")
    assert hops["memory at 80% -> 2 data tasks evicted and gone"] < 30
    assert any("node memory use raised to 80% through the simulated cgroup tree" in line
               for line in e2e.timeline.lines)
