"""The reclaim keeps the owner held in the kernel while slow borrowers die, then releases it; a
borrower whose pod does not decode is refused."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

from gpushare_common.bus import Transient
from gpushare_common.events import Event, KmodCommand, KmodReply
from gpushare_solver.actions import Reclaim, ReclaimProgress, Release
from gpushare_solver.metrics import SolverMetrics
from gpushare_solver.ports import TaskExit
from gpushare_solver.reclaim import Reclaimer
from gpushare_solver.settings import SolverSettings
from gpushare_solver.state import Victim
from prometheus_client import CollectorRegistry

from tests.solver.fakes import FakePods

NODE = "n1"
OWNER = "dev/alice"


@dataclass
class SlowTasks:
    """Borrower tasks whose exit takes until ``exited`` is set (a driver freeing GPU memory)."""

    exited: asyncio.Event = field(default_factory=asyncio.Event)
    done_at: float = 0.0

    async def pids(self, container_ids: list[str]) -> dict[str, int]:
        return {}

    async def kill_all(self, container_ids: list[str], timeout_s: float,
                       pids: dict[str, int] | None = None) -> list[TaskExit]:
        if container_ids:
            await self.exited.wait()
            self.done_at = self.done_at or time.monotonic()
        return [TaskExit(c, 137, False, 0.1) for c in container_ids]


@dataclass
class Kernel:
    """The kmod-bridge's answers: a hold moves the deadline (status 1) until ``holding`` ends."""

    timeout_ms: int = 300
    holding: bool = True
    failures: int = 0  # the next holds that get no answer
    sent: list[tuple[float, KmodCommand]] = field(default_factory=list)

    async def kmod(self, command: KmodCommand) -> KmodReply:
        self.sent.append((time.monotonic(), command))
        if command.op == "hold" and self.failures:
            self.failures -= 1
            raise Transient("request gpushare.v1.n1.kmod.cmd", "no responders")
        status = int(self.holding) if command.op == "hold" else 1
        return KmodReply(node=NODE, op=command.op, status=status, timeout_ms=self.timeout_ms)

    async def publish(self, subject: str, event: Event) -> None:
        pass

    async def publish_once(self, subject: str, event: Event) -> None:
        pass

    def ops(self, op: str) -> list[float]:
        return [t for t, c in self.sent if c.op == op]


def reclaimer(kernel: Kernel, tasks: SlowTasks, release_deadline_s: float = 10.0,
              pods: FakePods | None = None) -> Reclaimer:
    if pods is None:
        pods = FakePods()
        pods.add("spot/b1", NODE, ["b1-main"])
    settings = SolverSettings(release_deadline_s=release_deadline_s, kill_timeout_s=30.0)
    victims = {"spot/b1": Victim(uid="uid-b1", owner=OWNER)}  # taken out of the cache by a handler
    found = Reclaimer(NODE, settings, pods, tasks, kernel, "eviction", SolverMetrics(CollectorRegistry()),
                      lambda: victims)
    found.hold_first_s = 0.05
    return found


async def reclaim(found: Reclaimer) -> None:
    action = Reclaim(reason="owner-back", pods=("spot/b1",), owner=OWNER,
                     release=Release(pods=(OWNER,), pidns=(4026532001,)))

    async def save() -> None:
        pass

    await found.run(action, ReclaimProgress(), "trigger", time.time(), save)


async def test_slow_borrowers_are_held_for_every_third_of_the_timeout_then_released() -> None:
    kernel, tasks = Kernel(timeout_ms=600), SlowTasks()
    running = asyncio.create_task(reclaim(reclaimer(kernel, tasks)))
    await wait(lambda: len(kernel.ops("hold")) >= 4, "four holds")
    assert not kernel.ops("release"), "released while the borrower still runs"
    tasks.exited.set()
    await asyncio.wait_for(running, 5)
    holds, (release,) = kernel.ops("hold"), kernel.ops("release")
    assert release >= tasks.done_at and all(t < release for t in holds)
    gaps = [b - a for a, b in itertools.pairwise(holds)]
    assert all(0.19 <= gap < 0.6 for gap in gaps), gaps  # every timeout / 3: always before it ends
    assert all(c.pods == (OWNER,) and c.pidns == (4026532001,) for _, c in kernel.sent)


async def test_borrowers_that_die_at_once_cost_no_hold() -> None:
    kernel, tasks = Kernel(), SlowTasks()
    tasks.exited.set()
    await asyncio.wait_for(reclaim(reclaimer(kernel, tasks)), 5)
    assert [c.op for _, c in kernel.sent] == ["release"]


async def test_holding_stops_when_the_kernel_holds_no_longer() -> None:
    kernel, tasks = Kernel(holding=False), SlowTasks()
    running = asyncio.create_task(reclaim(reclaimer(kernel, tasks)))
    await wait(lambda: len(kernel.ops("hold")) == 1, "the first hold")
    await asyncio.sleep(0.3)  # the borrower takes three more hold intervals (0.1 s) to die
    assert len(kernel.ops("hold")) == 1  # none was sent for them
    tasks.exited.set()
    await asyncio.wait_for(running, 5)
    assert len(kernel.ops("release")) == 1


async def test_an_undelivered_hold_is_tried_again() -> None:
    kernel, tasks = Kernel(failures=2), SlowTasks()
    running = asyncio.create_task(reclaim(reclaimer(kernel, tasks)))
    await wait(lambda: len(kernel.ops("hold")) == 4, "two failed holds, then two held")
    tasks.exited.set()
    await asyncio.wait_for(running, 5)
    assert len(kernel.ops("release")) == 1


async def test_the_release_deadline_ends_the_holds() -> None:
    kernel, tasks = Kernel(), SlowTasks()
    await asyncio.wait_for(reclaim_until_released(kernel, tasks), 5)
    (release,) = kernel.ops("release")
    assert kernel.ops("hold") and all(t < release for t in kernel.ops("hold"))
    tasks.exited.set()


async def reclaim_until_released(kernel: Kernel, tasks: SlowTasks) -> None:
    running = asyncio.create_task(reclaim(reclaimer(kernel, tasks, release_deadline_s=0.5)))
    await wait(lambda: len(kernel.ops("release")) == 1, "the release at the deadline")
    holds = len(kernel.ops("hold"))
    tasks.exited.set()
    await running
    assert len(kernel.ops("hold")) == holds


async def wait(predicate: object, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.005)


async def test_a_borrower_whose_pod_does_not_decode_is_not_learnt_and_refused() -> None:
    kernel, tasks, pods = Kernel(), SlowTasks(), FakePods()
    pods.add("spot/b1", NODE, ["b1-main"])
    pods.pods["spot/b1"]["spec"]["priority"] = "high"
    tasks.exited.set()
    found = reclaimer(kernel, tasks, pods=pods)
    await found.learn("spot/b1")
    assert found.known == {}
    await asyncio.wait_for(reclaim(found), 5)
    assert pods.deleted == [] and found.metrics.refused.labels("malformed-pod")._value.get() == 1
    assert [c.op for _, c in kernel.sent] == ["release"]
