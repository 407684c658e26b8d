"""The node's use moving is published even when spare capacity does not change (the solver's pressure input)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from gpushare_common import events as ev
from gpushare_common.bus import Bus
from gpushare_common.pods import PodRules
from gpushare_common.settings import NatsSettings
from gpushare_detector.adapters.cgroups import PodsUsage
from gpushare_detector.capacity import Policy, usage_moved
from gpushare_detector.capacity_service import CapacityService
from gpushare_detector.cgroupstats import NodeStats, Usage
from gpushare_detector.metrics import DetectorMetrics
from gpushare_detector.pods import PodTracker
from prometheus_client import CollectorRegistry

from tests.detector import podfactory as pf
from tests.detector.harness import NODE, Collector, is_

GIB = 1 << 30
MEMORY = {"node_memory_used": 10.0, "node_memory_total": 100.0, "node_cpu_used_m": 0.0, "node_cpu_total_m": 8000.0}


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        ({**MEMORY, "node_memory_used": 15.0}, False),  # exactly 5%: quiet
        ({**MEMORY, "node_memory_used": 15.5}, True),
        ({**MEMORY, "node_memory_used": 4.0}, True),  # down counts too
        ({**MEMORY, "node_cpu_used_m": 500.0}, True),  # 6.25% of 8000m
        ({**MEMORY, "node_memory_total": 0.0, "node_memory_used": 50.0}, False),  # unknown total
        ({}, False),
    ],
)
def test_usage_moved_by_more_than_the_step(after: dict[str, float], expected: bool) -> None:
    assert usage_moved(MEMORY, after, 0.05) is expected


def test_nothing_published_before_counts_as_zero() -> None:
    assert usage_moved({}, MEMORY, 0.05) is True
    assert usage_moved({}, {**MEMORY, "node_memory_used": 1.0, "node_cpu_used_m": 0.0}, 0.05) is False


class Node:
    """8 CPUs, 32 GiB; an ordinary pod of 2 GiB and a batch pod whose working set the test sets."""

    def __init__(self) -> None:
        self.batch = 4 * GIB

    def sample(self) -> tuple[NodeStats, PodsUsage]:
        pods = {"uid-ns-web": Usage(0, 2 * GIB), "uid-ns-batch": Usage(0, self.batch)}
        return NodeStats(8, 0, 32 * GIB, 4 * GIB + 2 * GIB + self.batch), PodsUsage(2, pods)


@pytest.fixture
async def bus(nats_settings: NatsSettings) -> AsyncIterator[Bus]:
    bus = Bus(nats_settings, "capacity-usage-test")
    await bus.connect()
    await bus.wait_for_stream()
    yield bus
    await bus.drain()


async def test_batch_pod_growth_is_published_though_spare_capacity_is_unchanged(bus: Bus) -> None:
    seen = Collector()
    await bus.subscribe(bus.subjects.capacity(NODE, "vmem"), seen)
    tracker = PodTracker(PodRules(), NODE)
    for pod in (pf.pod("web"), pf.pod("batch", requests={"main": {"gpushare/vmem": "40"}})):
        view = tracker.read(pod)
        assert view is not None
        tracker.upsert(view, {})
    node, clock = Node(), [100.0]
    service = CapacityService(NODE, Policy(), bus, tracker, DetectorMetrics(CollectorRegistry()),
                              node.sample, 1.0, lambda: clock[0])
    for _ in range(2):
        await service.tick()
        clock[0] += 1
    first = await seen.wait_for(is_(ev.SpareCapacity, resource="vmem"))
    assert isinstance(first, ev.SpareCapacity)
    node.batch = 10 * GIB  # the batch pod grows: node use 10 -> 16 GiB of 32, spare unchanged
    await service.tick()
    grown = await seen.wait_for(lambda e: _memory_used(e) == 16 * GIB)
    assert isinstance(grown, ev.SpareCapacity) and grown.devices == first.devices
    published_at = service.published["vmem"][1]
    clock[0] += 1
    await service.tick()  # nothing moved: quiet
    assert service.published["vmem"][1] == published_at


def _memory_used(event: ev.AnyEvent) -> float | None:
    return event.inputs.get("node_memory_used") if isinstance(event, ev.SpareCapacity) else None
