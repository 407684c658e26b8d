"""The solver wired in memory (real nats-server, in-memory Kubernetes and containerd)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from gpushare_common.bus import Bus
from gpushare_common.events import (
    AnyEvent,
    EvictionRecord,
    LowPowerEvent,
    OwnerBackEvent,
    ReservedEvent,
    ShadowEvent,
    ShareEvent,
    SpotEvent,
    event_tag,
)
from gpushare_common.ids import ANN_DEVICE_OWNER, CONDITION_USING
from gpushare_common.settings import NatsSettings
from gpushare_solver import app
from gpushare_solver.settings import SolverSettings

from tests.solver.conftest import NODE, FakeBridge, wait_for
from tests.solver.fakes import FakePods, FakeTasks
from tests.solver.world import common_settings

OWNER = "dev/alice"


@contextlib.asynccontextmanager
async def wired(nats: NatsSettings, pods: FakePods, tasks: FakeTasks) -> AsyncIterator[app.Service]:
    stop = asyncio.Event()
    settings = SolverSettings(retry_first_s=0.05, retry_max_s=0.5, ack_wait_s=2.0, kmod_timeout_s=0.3)
    async with app.Service(common_settings(nats, Path("unused-kubeconfig"), NODE), settings,
                           stop, pods=pods, tasks_api=tasks, allocations=pods).started() as running:
        yield running
        stop.set()


async def publish_all(bus: Bus, events: list[AnyEvent]) -> None:
    for event in events:
        await bus.publish_persistent(bus.subjects.event(NODE, event_tag(event)), event)


SPOT = "gpushare/spot-gpu"


def owner_and_borrower() -> tuple[FakePods, FakeTasks]:
    """The owner's pod and the borrower spot/b1 on the node, the borrower's task running."""
    pods, tasks = FakePods(), FakeTasks(running={"b1-c"})
    pods.add(OWNER, NODE, ["owner-c"])
    pods.add("spot/b1", NODE, ["b1-c"], {SPOT: ("spot-GPU-0",)})
    return pods, tasks


async def eviction_recorder(nats_settings: NatsSettings) -> tuple[Bus, list[AnyEvent]]:
    """A client bus and every eviction record published from now on."""
    bus = Bus(nats_settings, "test")
    await bus.connect()
    records: list[AnyEvent] = []

    async def record(event: AnyEvent) -> None:
        records.append(event)

    await bus.subscribe(bus.subjects.eviction(NODE), record)
    return bus, records


async def lend_to_borrower(bus: Bus, running: app.Service) -> None:
    """The owner away, its card lent to spot/b1, as the solver knows it."""
    await publish_all(bus, [
        ReservedEvent(node=NODE, pod=OWNER, container="main", vendor_resource="v", state="using",
                     devices=("GPU-0",)),
        LowPowerEvent(node=NODE, owner=OWNER, using=False, devices=("GPU-0",)),
        SpotEvent(node=NODE, pod="spot/b1", container="c0", state="using", devices=("spot-GPU-0",)),
    ])
    await wait_for(lambda: running.solver.state.borrowers() == {"spot-GPU-0": "spot/b1"}, what="a borrower")


async def test_a_transient_containerd_failure_is_retried_and_finishes_once(
    nats_settings: NatsSettings, bridge: FakeBridge,
) -> None:
    pods, tasks = owner_and_borrower()
    bus, records = await eviction_recorder(nats_settings)
    try:
        async with wired(nats_settings, pods, tasks) as running:
            await lend_to_borrower(bus, running)
            tasks.failures = 1
            await publish_all(bus, [OwnerBackEvent(node=NODE, pidns=5, pid=1, kernel_ts_ns=1, pod=OWNER)])
            await wait_for(lambda: len(records) == 1, what="the eviction after a retry")
            assert tasks.calls >= 2 and pods.deleted == ["spot/b1"]
            assert isinstance(records[0], EvictionRecord) and records[0].outcome == "evicted"
            assert len(bridge.ops("release")) == 1
            await wait_for(lambda: not running.solver.plans, what="the plan forgotten")
    finally:
        await bus.drain()


async def test_share_using_patches_the_shadowpod_and_sharepod(
    nats_settings: NatsSettings, bridge: FakeBridge,
) -> None:
    pods, tasks = FakePods(), FakeTasks()
    pods.add("team/shadow", NODE, ["s"])
    pods.add("apps/infer", NODE, ["i"])
    bus = Bus(nats_settings, "test")
    await bus.connect()
    try:
        async with wired(nats_settings, pods, tasks):
            await publish_all(bus, [
                ShadowEvent(node=NODE, shadow_pod="team/shadow", state="running", resource="share-gpu-2",
                            share_spec=2),
                ShareEvent(node=NODE, share_pod="apps/infer", container="c0", resource="share-gpu-2",
                           state="using", devices=("team/shadow-1",)),
            ])
            await wait_for(lambda: len(pods.patches) == 2, what="two patches")
            (shadow, condition), (share, annotation) = sorted(pods.patches, key=lambda p: p[0] != "team/shadow")
            cond = condition["status"]["conditions"][0]
            assert (shadow, cond["type"], cond["status"]) == ("team/shadow", CONDITION_USING, "True")
            assert cond["message"] == '{"team/shadow-1":"apps/infer"}'
            assert (share, annotation) == ("apps/infer", {"metadata": {"annotations": {
                ANN_DEVICE_OWNER: "team/shadow"}}})
    finally:
        await bus.drain()


async def test_without_a_kmod_bridge_borrowers_are_still_evicted(nats_settings: NatsSettings) -> None:
    pods, tasks = FakePods(), FakeTasks(running={"b1-c"})
    pods.add(OWNER, NODE, ["owner-c"])
    pods.add("spot/b1", NODE, ["b1-c"], {SPOT: ("spot-GPU-0",)})
    bus = Bus(nats_settings, "test")
    await bus.connect()
    try:
        async with wired(nats_settings, pods, tasks) as running:
            await publish_all(bus, [
                ReservedEvent(node=NODE, pod=OWNER, container="main", vendor_resource="v", state="using",
                             devices=("GPU-0",)),
                LowPowerEvent(node=NODE, owner=OWNER, using=False, devices=("GPU-0",)),
                SpotEvent(node=NODE, pod="spot/b1", container="c0", state="using", devices=("spot-GPU-0",)),
                LowPowerEvent(node=NODE, owner=OWNER, using=True, devices=("GPU-0",)),
            ])
            await wait_for(lambda: pods.deleted == ["spot/b1"], what="the borrower deleted")
            await wait_for(lambda: not running.solver.plans, what="no plan left")
            assert running.solver.state.health == {"spot-GPU-0": "Unhealthy"}
            assert "b1-c" not in tasks.running
    finally:
        await bus.drain()


async def test_a_plan_failing_again_at_start_is_kept_and_its_eviction_happens_once(
    nats_settings: NatsSettings, bridge: FakeBridge,
) -> None:
    """An owner-back whose reclaim fails, then fails again while the restarted solver resumes its
    plan: the plan is not dropped (its event id is already applied, so the redelivery would be
    taken for a duplicate), and the borrower is evicted exactly once when containerd is back."""
    pods, tasks = owner_and_borrower()
    bus, records = await eviction_recorder(nats_settings)
    try:
        async with wired(nats_settings, pods, tasks) as running:
            await lend_to_borrower(bus, running)
            tasks.failures = 10_000  # containerd down for this whole run
            await publish_all(bus, [OwnerBackEvent(node=NODE, pidns=5, pid=1, kernel_ts_ns=1, pod=OWNER)])
            await wait_for(lambda: bool(running.solver.plans) and tasks.calls >= 2, what="a failing plan")
        assert records == [] and pods.deleted == []
        tasks.failures = 2  # still down when the next solver resumes the plan at start
        async with wired(nats_settings, pods, tasks) as running:
            await wait_for(lambda: len(records) == 1, what="the eviction after the restart")
            await wait_for(lambda: not running.solver.plans, what="the plan done")
            await asyncio.sleep(0.5)  # a redelivery or a retry must not evict again
        assert pods.deleted == ["spot/b1"] and len(records) == 1
        assert isinstance(records[0], EvictionRecord) and records[0].outcome == "evicted"
    finally:
        await bus.drain()


async def test_evicted_pods_leave_evicting_when_gone_also_after_a_restart(
    nats_settings: NatsSettings, bridge: FakeBridge,
) -> None:
    """/status names a pod under ``evicting`` only while its reclaim is pending: once the borrower
    is deleted it is gone from there, and a restarted solver (reading its journal) agrees."""
    pods, tasks = owner_and_borrower()
    bus, records = await eviction_recorder(nats_settings)
    try:
        async with wired(nats_settings, pods, tasks) as running:
            await lend_to_borrower(bus, running)
            await publish_all(bus, [OwnerBackEvent(node=NODE, pidns=5, pid=1, kernel_ts_ns=1, pod=OWNER)])
            await wait_for(lambda: len(records) == 1 and not running.solver.plans, what="the eviction done")
            assert running.solver.status()["evicting"] == {}
        async with wired(nats_settings, pods, tasks) as running:
            assert running.solver.status()["evicting"] == {}
    finally:
        await bus.drain()


def kills_timed(running: app.Service) -> float:
    return running.skeleton.registry.get_sample_value("gpushare_solver_kill_seconds_count",
                                                      {"reason": "owner-back"}) or 0.0


async def test_a_kill_is_timed_only_when_it_killed_a_task(nats_settings: NatsSettings, bridge: FakeBridge) -> None:
    """``gpushare_solver_kill_seconds`` observes a reclaim only when a task was there to kill: a
    borrower whose task had already exited is evicted without a kill-time observation."""
    pods, tasks = owner_and_borrower()
    tasks.running.clear()  # the borrower's task exited on its own
    bus, records = await eviction_recorder(nats_settings)
    try:
        async with wired(nats_settings, pods, tasks) as running:
            await lend_to_borrower(bus, running)
            await publish_all(bus, [OwnerBackEvent(node=NODE, pidns=5, pid=1, kernel_ts_ns=1, pod=OWNER)])
            await wait_for(lambda: len(records) == 1 and not running.solver.plans, what="the eviction done")
            assert tasks.calls >= 1 and kills_timed(running) == 0
            pods.add("spot/b2", NODE, ["b2-c"], {SPOT: ("spot-GPU-0",)})
            tasks.running.add("b2-c")
            await publish_all(bus, [
                LowPowerEvent(node=NODE, owner=OWNER, using=False, devices=("GPU-0",)),
                SpotEvent(node=NODE, pod="spot/b2", container="c0", state="using", devices=("spot-GPU-0",)),
                OwnerBackEvent(node=NODE, pidns=5, pid=2, kernel_ts_ns=2, pod=OWNER),
            ])
            await wait_for(lambda: len(records) == 2 and not running.solver.plans, what="the second eviction")
            assert "b2-c" not in tasks.running and kills_timed(running) == 1
    finally:
        await bus.drain()
