"""The pressure watch's view in /status: the last sample judged, what is over, what was evicted."""

from __future__ import annotations

from gpushare_common.events import SpareCapacity
from gpushare_solver.oversell import PressureWatch
from gpushare_solver.pressure import PressurePolicy

from tests.solver.fakes import FakePods

NODE = "node-1"
GIB = 1 << 30


def sample(memory_gib: float) -> SpareCapacity:
    return SpareCapacity(node=NODE, resource="vmem", devices=0, unit=GIB, inputs={
        "node_cpu_used_m": 1000.0, "node_cpu_total_m": 4000.0,
        "node_memory_used": memory_gib * GIB, "node_memory_total": 16.0 * GIB})  # fmt: skip


def oversold(pods: FakePods, key: str, priority: int, created: str) -> None:
    pods.add(key, NODE, [f"{key.split('/')[1]}-main"])
    pod = pods.pods[key]
    pod["metadata"]["creationTimestamp"] = created
    pod["spec"].update(priority=priority, containers=[{"name": "main", "resources": {"requests": {
        "gpushare/vmem": "1"}}}])  # fmt: skip


async def test_status_before_any_sample() -> None:
    watch = PressureWatch(NODE, PressurePolicy(), FakePods(), _never)
    status = watch.status()
    assert status["samples"] == 0 and status["memory_used_ratio"] is None and status["over"] == []
    assert status["since_last_eviction_s"] is None and status["evicted"] == []


async def test_status_follows_samples_and_lists_evictions_in_order() -> None:
    pods, evicted, clock = FakePods(), [], [100.0]
    oversold(pods, "batch/old", 0, "2026-01-01T00:00:00Z")
    oversold(pods, "batch/new", 0, "2026-01-01T00:00:05Z")
    oversold(pods, "batch/high", 10, "2026-01-01T00:00:09Z")

    async def evict(trigger: str, victims: dict[str, str], over: tuple[str, ...]) -> None:
        assert over == ("memory",)
        evicted.append((trigger, victims))

    watch = PressureWatch(NODE, PressurePolicy(cooldown_s=30), pods, evict, lambda: clock[0])
    await watch.on_event(sample(13.0))  # 81.25%: two 1 GiB pods bring it under 70%
    assert [victims for _, victims in evicted] == [{"batch/new": "uid-new", "batch/old": "uid-old"}]
    assert list(evicted[0][1]) == ["batch/new", "batch/old"]  # newest first
    clock[0] += 2
    status = watch.status()
    assert status["over"] == ["memory"] and status["memory_used_ratio"] == 0.8125
    assert status["evicted"] == ["batch/new", "batch/old"] and status["since_last_eviction_s"] == 2
    await watch.on_event(sample(11.0))  # 68.75%: under the threshold, nothing more
    status = watch.status()
    assert status["samples"] == 2 and status["over"] == [] and status["memory_used_ratio"] == 0.6875
    assert len(evicted) == 1 and status["cpu_used_ratio"] == 0.25


async def test_pods_that_do_not_decode_or_are_going_are_no_candidates() -> None:
    pods, evicted = FakePods(), []
    oversold(pods, "batch/odd", 0, "2026-01-01T00:00:09Z")
    pods.pods["batch/odd"]["spec"]["containers"][0]["resources"]["requests"]["gpushare/vmem"] = "1.5"
    oversold(pods, "batch/done", 0, "2026-01-01T00:00:08Z")
    pods.pods["batch/done"]["status"]["phase"] = "Succeeded"
    oversold(pods, "batch/leaving", 0, "2026-01-01T00:00:07Z")
    pods.pods["batch/leaving"]["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    oversold(pods, "batch/ok", 0, "2026-01-01T00:00:00Z")

    async def evict(trigger: str, victims: dict[str, str], over: tuple[str, ...]) -> None:
        evicted.append(victims)

    await PressureWatch(NODE, PressurePolicy(), pods, evict).on_event(sample(15.0))
    assert evicted == [{"batch/ok": "uid-ok"}]


async def _never(trigger: str, victims: dict[str, str], over: tuple[str, ...]) -> None:
    raise AssertionError(f"nothing should be evicted, got {victims} for {trigger}")
