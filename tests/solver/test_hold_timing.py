"""One source for every owner-back timer: the kernel module's ``timeout_ms`` and ``max_hold_ms``.

Written into the kernel stand-in at run time (as through ``/sys/module/gpushare/parameters``),
they move the kmod-bridge's HOLD cadence, the kernel's own end of the holding, and the solver's
wait for killed borrowers (read through the kmod-bridge). A real nats-server, the real
kmod-bridge and solver; the borrower's task never dies (the solver's task port), so every
bound is reached.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from gpushare_common.events import LowPowerEvent, ReservedEvent, SpotEvent
from gpushare_common.settings import NatsSettings
from gpushare_kmod_bridge.app import Service as BridgeService
from gpushare_kmod_bridge.resolver import ContainerProcs
from gpushare_sim.kernel import KernelStandIn
from gpushare_solver import app
from gpushare_solver.ports import ContainerdUnavailable, TaskExit
from gpushare_solver.settings import SolverSettings

from tests.kmod_bridge.conftest import PidnsProcess, ioctl, kernel, pidns_process, sock_dir  # noqa: F401
from tests.kmod_bridge.test_service import FixedSource, bridge_settings
from tests.solver.conftest import NODE, wait_for
from tests.solver.fakes import FakePods
from tests.solver.world import client_bus, common_settings

OWNER, BORROWER = "dev/alice", "spot/b1"


@dataclass
class UndyingTasks:
    """A borrower whose task never exits (stuck in a driver): every kill waits its whole timeout."""

    waits: list[float] = field(default_factory=list)

    async def pids(self, container_ids: list[str]) -> dict[str, int]:
        return {}

    async def kill_all(self, container_ids: list[str], timeout_s: float,
                       pids: dict[str, int] | None = None) -> list[TaskExit]:
        if not container_ids:
            return []
        self.waits.append(timeout_s)
        await asyncio.sleep(timeout_s)  # containerd's Wait, which sees no exit
        raise ContainerdUnavailable(f"wait task {container_ids[0]}: no exit within {timeout_s}s")


@contextlib.asynccontextmanager
async def node(nats: NatsSettings, stand_in: KernelStandIn, owner: PidnsProcess,
               tasks: UndyingTasks) -> AsyncIterator[tuple[BridgeService, app.Service]]:
    pods = FakePods()
    pods.add(OWNER, NODE, ["alice-main"])
    pods.add(BORROWER, NODE, ["b1-main"], {"gpushare/spot-gpu": ("spot-GPU-0",)})  # the kubelet's word too
    common = common_settings(nats, Path("unused-kubeconfig"), NODE)  # the pods come through the pod port
    bridge = BridgeService(common, bridge_settings(stand_in),
                           sources=[FixedSource(ContainerProcs("alice-main", (owner.pid,), OWNER, "c0"))])
    stop = asyncio.Event()
    settings = SolverSettings(retry_first_s=0.05, retry_max_s=0.5, ack_wait_s=5.0, pod_resources_socket="")
    try:
        await bridge.start()
        await asyncio.wait_for(bridge.link.registered.wait(), 5)
        solver = app.Service(common, settings, stop, pods=pods, tasks_api=tasks, allocations=pods)
        async with solver.started() as running:
            yield bridge, running
            stop.set()
    finally:
        await bridge.close()


@pytest.mark.parametrize(("timeout_ms", "max_hold_ms"), [(450, 1200), (900, 2100)])
async def test_the_modules_parameters_move_every_timer_of_an_owner_back(
    nats_settings: NatsSettings, kernel: KernelStandIn, pidns_process: PidnsProcess,  # noqa: F811
    timeout_ms: int, max_hold_ms: int,
) -> None:
    tasks = UndyingTasks()
    async with client_bus(nats_settings) as bus, node(nats_settings, kernel, pidns_process, tasks) as (bridge, running):
        kernel.state.timeout_ms, kernel.state.max_hold_ms = timeout_ms, max_hold_ms  # written at run time
        await wait_for(lambda: bridge.link.timing.max_hold_ms == max_hold_ms, what="the bridge reading them")
        for event in (
            ReservedEvent(node=NODE, pod=OWNER, container="c0", vendor_resource="nvidia.com/gpu", state="using",
                          devices=("GPU-0",), lendable=True),
            LowPowerEvent(node=NODE, owner=OWNER, using=False, devices=("GPU-0",)),
            SpotEvent(node=NODE, pod=BORROWER, container="c0", state="using", devices=("spot-GPU-0",)),
        ):
            await bus.publish_persistent(bus.subjects.event(NODE, type(event).__struct_config__.tag), event)  # type: ignore[attr-defined]
        await wait_for(lambda: running.solver.state.borrowers() == {"spot-GPU-0": BORROWER}, what="the card lent")
        timing = running.solver.reclaimer.timing
        assert (timing.timeout_ms, timing.max_hold_ms, timing.known) == (timeout_ms, max_hold_ms, True)

        blocked_ms = await asyncio.wait_for(ioctl(kernel.hook_path, pidns_process.pidns, pid=pidns_process.pid), 10)
        assert max_hold_ms - 20 <= blocked_ms <= max_hold_ms + 500, "the kernel ends the hold at max_hold_ms"
        holds = bridge.registry.get_sample_value("gpushare_kmod_bridge_holds_total") or 0
        every_ms = timeout_ms / 3
        assert max_hold_ms / every_ms - 4 <= holds <= max_hold_ms / every_ms, "a HOLD every third of timeout_ms"
        assert bridge.registry.get_sample_value("gpushare_kmod_bridge_holds_exhausted_total") == 1
        await wait_for(lambda: tasks.waits, what="the solver's kill")
        assert set(tasks.waits) == {max_hold_ms / 1000}, "the solver waits for its kill as long as the kernel holds"
        (entry,) = kernel.state.stats([pidns_process.pidns])
        assert (entry.timeouts, entry.releases) == (1, 0), "a failed kill releases nothing"
