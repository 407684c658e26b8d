"""Owner back end to end: the owner's GPU call blocks in the kernel stand-in, the real kmod-bridge
publishes the owner-back event, the solver kills and evicts the borrowers (real containerd, API
emulator) and releases the owner, whose call then returns."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from gpushare_common.adapters.kube import Kube
from gpushare_common.bus import Bus
from gpushare_common.events import EvictionRecord, LowPowerEvent, ReservedEvent, SpotEvent
from gpushare_common.settings import NatsSettings
from gpushare_kmod_bridge.app import Service as BridgeService
from gpushare_kmod_bridge.resolver import ContainerProcs
from gpushare_sim.containerd import Containerd
from gpushare_sim.kernel import KernelStandIn
from gpushare_solver import app
from gpushare_solver.adapters.containerd import Tasks

from tests.kmod_bridge.conftest import ioctl, kernel, sock_dir  # noqa: F401  (fixtures)
from tests.kmod_bridge.test_service import FixedSource, bridge_settings
from tests.solver.conftest import NODE, wait_for
from tests.solver.test_integration import Recorder
from tests.solver.world import NAMESPACE, World, client_bus, common_settings, solver_settings
from tests.support.kubeapi import KubeApi
from tests.support.kubelet import Kubelet

pytestmark = [pytest.mark.containerd, pytest.mark.slow]
OWNER = "dev/alice"
SPOT = "gpushare/spot-gpu"


@contextlib.asynccontextmanager
async def kmod_bridge(nats: NatsSettings, kubeconfig: Path, stand_in: KernelStandIn,
                      owner: ContainerProcs) -> AsyncIterator[BridgeService]:
    service = BridgeService(common_settings(nats, kubeconfig, NODE), bridge_settings(stand_in),
                            sources=[FixedSource(owner)])
    try:
        await service.start()
        await asyncio.wait_for(service.link.registered.wait(), 5)
        yield service
    finally:
        await service.close()


async def the_owner(world: World, bus: Bus, containerd: Containerd) -> tuple[int, int, ContainerProcs, Recorder]:
    """The owner's init pid and pid namespace, as the kmod-bridge sees it, and the eviction records."""
    async with Tasks(str(containerd.address), NAMESPACE) as tasks:
        owner_pid = await tasks.pid("alice-main")
    records = Recorder()
    await bus.subscribe(bus.subjects.eviction(NODE), records)
    return (owner_pid, os.stat(f"/proc/{owner_pid}/ns/pid").st_ino,
            ContainerProcs("alice-main", (owner_pid,), OWNER, "c0"), records)


async def lend_to_b1(world: World, running: app.Service) -> None:
    """The owner holds GPU-0, goes away, and spot/b1 borrows its card."""
    for event in (
        ReservedEvent(node=NODE, pod=OWNER, container="c0", vendor_resource="nvidia.com/gpu", state="using",
                      devices=("GPU-0",), lendable=True),
        LowPowerEvent(node=NODE, owner=OWNER, using=False, devices=("GPU-0",)),
        SpotEvent(node=NODE, pod="spot/b1", container="c0", state="using", devices=("spot-GPU-0",)),
    ):
        await world.publish(type(event).__struct_config__.tag, event)  # type: ignore[attr-defined]
    await wait_for(lambda: running.solver.state.borrowers() == {"spot-GPU-0": "spot/b1"}, what="the card lent")


async def test_owner_call_blocks_until_borrowers_are_gone(
    nats_settings: NatsSettings, kube_api: KubeApi, kube: Kube, containerd: Containerd, rootfs: Path,
    kubelet: Kubelet,
    kernel: KernelStandIn,  # noqa: F811
) -> None:
    async with client_bus(nats_settings) as bus:
        world = World(containerd, rootfs, kube, bus, NODE, kubelet)
        await world.add_pod(OWNER, ["alice-main"])
        await world.add_pod("spot/b1", ["b1-main"], devices={SPOT: ["spot-GPU-0"]})
        owner_pid, pidns, owner, records = await the_owner(world, bus, containerd)
        stop = asyncio.Event()
        async with kmod_bridge(nats_settings, kube_api.kubeconfig, kernel, owner), \
                app.Service(common_settings(nats_settings, kube_api.kubeconfig, NODE),
                            solver_settings(containerd, kubelet), stop, pods=kube).started() as running:
            await lend_to_b1(world, running)
            blocked_ms = await asyncio.wait_for(ioctl(kernel.hook_path, pidns, pid=owner_pid), 10)
            assert blocked_ms < 2000, "the owner must be released well before the kernel's timeout"
            assert world.task_status("b1-main") == "STOPPED"
            assert world.task_status("alice-main") == "RUNNING"
            await wait_for(lambda: len(records.events) == 1, what="the eviction record")
            record = records.of(EvictionRecord)[0]
            assert (record.pod, record.reason, record.owner) == ("spot/b1", "owner-back", OWNER)  # type: ignore[attr-defined]
            assert not await world.pod_exists("spot/b1")
            assert running.solver.state.health == {"spot-GPU-0": "Unhealthy"}
            stop.set()


async def test_a_borrower_not_reported_yet_dies_before_the_owner_is_released(
    nats_settings: NatsSettings, kube_api: KubeApi, kube: Kube, containerd: Containerd, rootfs: Path,
    kubelet: Kubelet,
    kernel: KernelStandIn,  # noqa: F811
) -> None:
    """The owner comes back while a borrower's SpotEvent has not reached the solver yet (the
    detector is seconds behind on a busy node): the kubelet's pod-resources names it, and it is
    killed before the owner's call goes on. Its SpotEvent, arriving afterwards, evicts nothing."""
    async with client_bus(nats_settings) as bus:
        world = World(containerd, rootfs, kube, bus, NODE, kubelet)
        await world.add_pod(OWNER, ["alice-main"])
        await world.add_pod("spot/b1", ["b1-main"], devices={SPOT: ["spot-GPU-0"]})
        await world.add_pod("spot/late", ["late-main"], devices={SPOT: ["spot-GPU-0"]})
        kubelet.allocate("spot/other", "c0", SPOT, ["spot-GPU-1"])  # another card: left alone
        owner_pid, pidns, owner, records = await the_owner(world, bus, containerd)
        stop = asyncio.Event()
        settings = solver_settings(containerd, kubelet)
        async with kmod_bridge(nats_settings, kube_api.kubeconfig, kernel, owner), \
                app.Service(common_settings(nats_settings, kube_api.kubeconfig, NODE), settings, stop,
                            pods=kube).started() as running:
            await lend_to_b1(world, running)
            async with Tasks(str(containerd.address), NAMESPACE) as tasks:
                late_pid = await tasks.pid("late-main")
            late_ns = os.stat(f"/proc/{late_pid}/ns/pid").st_ino
            kernel.state.guards.arm(pidns, [late_ns], [late_pid])  # judged at the instant of release
            assert await asyncio.wait_for(ioctl(kernel.hook_path, pidns, pid=owner_pid), 10) < 2000
            (verdict,) = kernel.state.guards.verdicts
            assert verdict["how"] == "release" and verdict["alive"] == [], verdict
            assert world.task_status("late-main") == "STOPPED" and world.task_status("b1-main") == "STOPPED"
            await wait_for(lambda: len(records.events) == 2, what="two eviction records")
            evicted = sorted((r.pod, r.reason, r.owner) for r in records.of(EvictionRecord))  # type: ignore[attr-defined]
            assert evicted == [("spot/b1", "owner-back", OWNER), ("spot/late", "owner-back", OWNER)]
            assert not await world.pod_exists("spot/late")
            late = SpotEvent(node=NODE, pod="spot/late", container="c0", state="using", devices=("spot-GPU-0",))
            await world.publish("spot", late)
            await wait_for(lambda: late.id in running.solver.seen, what="the late SpotEvent handled")
            await asyncio.sleep(0.3)
            assert len(records.events) == 2, "the borrower found through the kubelet was evicted twice"
            found = running.skeleton.registry.get_sample_value("gpushare_solver_borrowers_discovered_total",
                                                               {"outcome": "found"})
            assert found == 1
            stop.set()
