"""The reclaim releases the owner once the borrowers are dead, and waits for them as long as the
kernel may hold the owner: the kernel's ``max_hold_ms``, learned from the kmod-bridge's replies.
The solver sends no HOLD (the kmod-bridge is the one holder); a borrower whose pod does not
decode is refused."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from gpushare_common.bus import Transient
from gpushare_common.events import Event, KmodCommand, KmodReply
from gpushare_common.hold import MODULE_MAX_HOLD_MS
from gpushare_solver.actions import Reclaim, ReclaimProgress, Release
from gpushare_solver.metrics import SolverMetrics
from gpushare_solver.ports import ContainerdUnavailable, TaskExit
from gpushare_solver.reclaim import Reclaimer
from gpushare_solver.settings import SolverSettings
from gpushare_solver.state import Victim
from prometheus_client import CollectorRegistry

from tests.solver.fakes import FakePods

NODE = "n1"
OWNER = "dev/alice"


@dataclass
class SlowTasks:
    """Borrower tasks whose exit takes until ``exited`` is set (a driver freeing GPU memory); a
    wait longer than its timeout fails as containerd's does."""

    exited: asyncio.Event = field(default_factory=asyncio.Event)
    done_at: float = 0.0
    waits: list[float] = field(default_factory=list)  # the timeout of every kill

    async def pids(self, container_ids: list[str]) -> dict[str, int]:
        return {}

    async def kill_all(self, container_ids: list[str], timeout_s: float,
                       pids: dict[str, int] | None = None) -> list[TaskExit]:
        self.waits.append(timeout_s)
        if container_ids:
            try:
                await asyncio.wait_for(self.exited.wait(), timeout_s)
            except TimeoutError:
                raise ContainerdUnavailable(f"wait task: no exit within {timeout_s}s") from None
            self.done_at = self.done_at or time.monotonic()
        return [TaskExit(c, 137, False, 0.1) for c in container_ids]


@dataclass
class Kernel:
    """The kmod-bridge's answers, carrying the kernel's hold parameters (0: not known yet)."""

    max_hold_ms: int = 0
    failures: int = 0  # the next requests that get no answer
    sent: list[tuple[float, KmodCommand]] = field(default_factory=list)

    async def kmod(self, command: KmodCommand) -> KmodReply:
        self.sent.append((time.monotonic(), command))
        if self.failures:
            self.failures -= 1
            raise Transient("request gpushare.v1.n1.kmod.solver", "no responders")
        return KmodReply(node=NODE, op=command.op, status=1, timeout_ms=300 if self.max_hold_ms else 0,
                         max_hold_ms=self.max_hold_ms)

    async def publish(self, subject: str, event: Event) -> None:
        pass

    async def publish_once(self, subject: str, event: Event) -> None:
        pass

    def ops(self, op: str) -> list[float]:
        return [t for t, c in self.sent if c.op == op]


def reclaimer(kernel: Kernel, tasks: SlowTasks, pods: FakePods | None = None) -> Reclaimer:
    if pods is None:
        pods = FakePods()
        pods.add("spot/b1", NODE, ["b1-main"], {"gpushare/spot-gpu": ("spot-GPU-0",)})
    victims = {"spot/b1": Victim(uid="uid-b1", owner=OWNER, devices=("spot-GPU-0",))}  # taken out by a handler
    return Reclaimer(NODE, SolverSettings(), pods, tasks, kernel, "eviction", SolverMetrics(CollectorRegistry()),
                     lambda: victims, allocations=pods)


async def reclaim(found: Reclaimer) -> None:
    action = Reclaim(reason="owner-back", pods=("spot/b1",), owner=OWNER,
                     release=Release(pods=(OWNER,), pidns=(4026532001,)))

    async def save() -> None:
        pass

    await found.run(action, ReclaimProgress(), "trigger", time.time(), save)


async def test_slow_borrowers_are_waited_for_without_a_hold_then_the_owner_is_released() -> None:
    kernel, tasks = Kernel(), SlowTasks()
    running = asyncio.create_task(reclaim(reclaimer(kernel, tasks)))
    await wait(lambda: tasks.waits, "the kill")
    await asyncio.sleep(0.3)  # the borrower is slow to die: the solver holds nothing meanwhile
    assert kernel.sent == [], "the kmod-bridge holds the owner; the solver sends nothing until the release"
    tasks.exited.set()
    await asyncio.wait_for(running, 5)
    (release,) = kernel.ops("release")
    assert release >= tasks.done_at
    assert [c.op for _, c in kernel.sent] == ["release"]


async def test_the_kill_waits_as_long_as_the_kernel_may_hold_the_owner() -> None:
    """The kernel's max_hold_ms, read at start through the kmod-bridge, is the kill's wait: a
    borrower that outlives it fails the kill, and a failed kill releases nothing."""
    kernel, tasks = Kernel(max_hold_ms=400), SlowTasks()
    found = reclaimer(kernel, tasks)
    assert found.timing.max_hold_ms == MODULE_MAX_HOLD_MS and not found.timing.known
    await asyncio.wait_for(found.read_timing(asyncio.Event()), 5)
    assert (found.timing.max_hold_ms, found.timing.known) == (400, True)
    started = time.monotonic()
    try:
        await asyncio.wait_for(reclaim(found), 5)
    except ContainerdUnavailable:
        pass
    else:
        raise AssertionError("a borrower alive after the kernel's max_hold_ms must fail the kill")
    assert set(tasks.waits) == {0.4} and 0.35 <= time.monotonic() - started < 2.0
    assert kernel.ops("release") == []


async def test_the_kernels_hold_parameters_are_read_until_a_kmod_bridge_answers() -> None:
    kernel, tasks = Kernel(max_hold_ms=1234, failures=2), SlowTasks()
    found = reclaimer(kernel, tasks)
    await asyncio.wait_for(found.read_timing(asyncio.Event()), 10)
    assert len(kernel.ops("stats")) == 3 and found.timing.max_hold_ms == 1234
    tasks.exited.set()
    await asyncio.wait_for(reclaim(found), 5)
    assert set(tasks.waits) == {1.234}


async def test_a_reply_without_the_kernels_parameters_keeps_the_last_known() -> None:
    kernel, tasks = Kernel(max_hold_ms=800), SlowTasks()
    found = reclaimer(kernel, tasks)
    await found.read_timing(asyncio.Event())
    kernel.max_hold_ms = 0  # a bridge that has not registered with the kernel yet
    tasks.exited.set()
    await asyncio.wait_for(reclaim(found), 5)
    assert found.timing.max_hold_ms == 800 and set(tasks.waits) == {0.8}


async def wait(predicate: object, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.005)


async def test_a_borrower_whose_pod_does_not_decode_is_not_learnt_and_refused() -> None:
    kernel, tasks, pods = Kernel(), SlowTasks(), FakePods()
    pods.add("spot/b1", NODE, ["b1-main"], {"gpushare/spot-gpu": ("spot-GPU-0",)})
    pods.pods["spot/b1"]["spec"]["priority"] = "high"
    tasks.exited.set()
    found = reclaimer(kernel, tasks, pods=pods)
    await found.learn("spot/b1")
    assert found.known == {}
    await asyncio.wait_for(reclaim(found), 5)
    assert pods.deleted == [] and found.metrics.refused.labels("malformed-pod")._value.get() == 1
    assert [c.op for _, c in kernel.sent] == ["release"]
