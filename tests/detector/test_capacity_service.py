"""Spare capacity published on NATS: two samples make a rate, batch pods are excluded, stale means zero."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from gpushare_common import events as ev
from gpushare_common.bus import Bus
from gpushare_common.pods import PodRules
from gpushare_common.settings import NatsSettings
from gpushare_detector.adapters.cgroups import PodsUsage
from gpushare_detector.capacity import Policy
from gpushare_detector.capacity_service import CapacityService
from gpushare_detector.cgroupstats import NodeStats, StatsError, Usage
from gpushare_detector.metrics import DetectorMetrics
from gpushare_detector.pods import PodTracker
from prometheus_client import CollectorRegistry

from tests.detector import podfactory as pf
from tests.detector.harness import NODE, Collector, is_

GIB = 1 << 30
SECOND = 1_000_000_000


class Node:
    """Cumulative counters that advance as the test says."""

    def __init__(self) -> None:
        self.busy_ns = 0
        self.pods = {"uid-ns-web": Usage(0, 2 * GIB), "uid-ns-batch": Usage(0, 4 * GIB)}
        self.broken = False

    def sample(self) -> tuple[NodeStats, PodsUsage]:
        if self.broken:
            raise StatsError("/proc/stat", "cannot read")
        return NodeStats(8, self.busy_ns, 32 * GIB, 10 * GIB), PodsUsage(2, dict(self.pods))

    def run(self, seconds: float, web_cores: float, batch_cores: float, system_cores: float) -> None:
        for uid, cores in (("uid-ns-web", web_cores), ("uid-ns-batch", batch_cores)):
            self.pods[uid] = Usage(self.pods[uid].cpu_ns + int(cores * seconds * SECOND), self.pods[uid].memory)
        self.busy_ns += int((web_cores + batch_cores + system_cores) * seconds * SECOND)


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def bus(nats_settings: NatsSettings) -> AsyncIterator[Bus]:
    bus = Bus(nats_settings, "capacity-test")
    await bus.connect()
    await bus.wait_for_stream()
    yield bus
    await bus.drain()


async def test_spare_capacity_events(bus: Bus) -> None:
    seen = Collector()
    await bus.subscribe(bus.subjects.node_capacity(NODE), seen)
    tracker = PodTracker(PodRules(), NODE)
    for pod in (pf.pod("web"), pf.pod("batch", requests={"main": {"gpushare/vcpu": "10"}})):
        view = tracker.read(pod)
        assert view is not None
        tracker.upsert(view, {})
    node, clock = Node(), Clock()
    service = CapacityService(NODE, Policy(margin_ratio=0.1, reserved_millicores=500), bus, tracker,
                              DetectorMetrics(CollectorRegistry()), node.sample, 1.0, clock)
    await service.tick()
    assert seen.events == []  # one sample: no rate yet
    node.run(10, web_cores=2, batch_cores=3, system_cores=1)
    clock.now += 10
    await service.tick()
    vcpu = await seen.wait_for(is_(ev.SpareCapacity, resource="vcpu"))
    # 8000 - 800 - max(1000 system, 500 reserved) - 2000 web (batch excluded) = 4200m = 42 devices
    assert isinstance(vcpu, ev.SpareCapacity) and (vcpu.devices, vcpu.unit) == (42, 100)
    assert vcpu.inputs["node_cpu_used_m"] == pytest.approx(6000)
    vmem = await seen.wait_for(is_(ev.SpareCapacity, resource="vmem"))
    # 32 GiB - 3.2 GiB - max(10 - 6 = 4 GiB system, 0) - 2 GiB web = 22.8 GiB = 91 devices of 256 MiB
    assert isinstance(vmem, ev.SpareCapacity) and vmem.devices == 91 and vmem.unit == 256 << 20

    node.run(10, web_cores=2.2, batch_cores=3, system_cores=1)  # < 10% change: quiet
    clock.now += 10
    await service.tick()
    assert len(seen.events) == 2

    node.broken = True
    clock.now += 901  # statistics older than 15 minutes: advertise nothing
    await service.tick()
    zero = await seen.wait_for(is_(ev.SpareCapacity, resource="vcpu", devices=0))
    assert "stale_for_s" in zero.inputs  # type: ignore[union-attr]
    assert service.status()["error"]
