"""The real node beside the fleet: the owner-back path end to end, on the fleet's NATS cluster.

As ``bench.solver --chain`` runs it: the real solver (a private containerd
with real runc borrowers, the API emulator), the real kmod-bridge and the
kernel stand-in, each its own process, all on the same stream and buckets as
the fleet. One trial: a dev machine's owner goes away, borrowers (real
containers and pods) take its cards, the owner's simulated GPU call blocks in
the stand-in, whose notice goes through the bridge, the stream and the
solver's durable consumer; figure: how long the owner's call was held (the
stand-in's own measure). A call held past the stand-in's timeout was kept by HOLD (the
kmod-bridge holds an owner-back the solver has not answered, the solver holds while its
borrowers die): whether the owner went on beside a borrower is read from when containerd
saw the last borrower exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpushare_common.adapters.kube import Kube, KubeError
from gpushare_common.bus import Bus, BusError
from gpushare_common.events import Event, LowPowerEvent, ReservedEvent, SpotEvent
from gpushare_common.layout import Layout
from gpushare_common.retry import Stopped
from gpushare_common.settings import KubeSettings, NatsSettings
from gpushare_sim.containerd import Containerd
from gpushare_sim.run.kubeapi import ensure_namespace
from gpushare_solver.adapters.containerd import Tasks
from gpushare_solver.ports import ContainerdError

from bench.procs import process
from bench.solver.__main__ import remove_container, run_container
from bench.solver.chain import OWNER_CONTAINER, _bridge_env, detect_ready, owner_ioctl, start_owner
from bench.solver.node import NODE, Node, _wait_file, solver_env
from tests.detector.podres_server import serve_pod_resources
from tests.runtime.conftest import make_rootfs
from tests.solver.world import NAMESPACE, container_statuses, pod_body
from tests.support.service import http_port

OWNER = "dev/owner"
KERNEL_TIMEOUT_MS = 3000  # the reference design's fixed hold
STEP_TIMEOUT_S = 15.0  # the longest any step of a trial may take (then the trial failed)


@dataclass(frozen=True, slots=True)
class TrialResult:
    held_ms: float  # how long the owner's call was held (nan: the trial failed before the call)
    at: float  # monotonic time of the owner's call
    evicted: bool  # every borrower's task exited within STEP_TIMEOUT_S (containerd's Wait)
    error: str = ""
    dead_ms: float = float("nan")  # the owner's call -> containerd saw the last borrower exit

    @property
    def by_timeout(self) -> bool:
        """Held at least the kernel's timeout: the kmod-bridge or the solver kept the owner held
        (HOLD) until the borrowers were dead."""
        return self.held_ms >= KERNEL_TIMEOUT_MS - 1


class NatsTarget(Protocol):
    """Where the real node's services connect: the cluster, or the node's own leaf server."""

    @property
    def url(self) -> str: ...

    def settings(self, **overrides: Any) -> NatsSettings: ...


def nats_env(cluster: NatsTarget, layout: Layout) -> dict[str, str]:
    """The services' NATS settings on the cluster, or their leaf (the installer made the stream and
    buckets)."""
    return {"GPUSHARE_NATS_URL": cluster.url, "GPUSHARE_NATS_PREFIX": layout.prefix,
            "GPUSHARE_NATS_STREAM": layout.stream, "GPUSHARE_NATS_KV_PREFIX": layout.kv_prefix,
            "GPUSHARE_NATS_ENSURE_LAYOUT": "false",
            "GPUSHARE_NATS_STREAM_REPLICAS": str(cluster.settings().stream_replicas)}  # fmt: skip


class RealNode:
    def __init__(self, node: Node, bus: Bus, kube: Kube, tasks: Tasks, hook: Path, owner: tuple[int, int],
                 cards: int) -> None:  # fmt: skip
        self.node, self.bus, self.kube, self.tasks, self.hook = node, bus, kube, tasks, hook
        self.pid, self.pidns = owner
        self.cards = [f"GPU-{i}" for i in range(cards)]
        self.number = 0

    async def publish(self, kind: str, event: Event) -> None:
        await self.bus.publish_reliably(self.bus.subjects.event(NODE, kind), event, deadline_s=STEP_TIMEOUT_S)

    async def until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if await asyncio.to_thread(predicate):
                    return True
            await asyncio.sleep(0.02)
        return False

    def borrowers(self) -> int:
        return len(self.node.status()["borrowers"])

    async def lend(self, containers: list[str]) -> None:
        await asyncio.gather(*(run_container(self.node, c) for c in containers))
        for container_id in containers:
            await self.kube.create_pod("spot", pod_body(container_id, NODE, [container_id]))
            await self.kube.patch_pod_status("spot", container_id, container_statuses([container_id]),
                                             strategic=False)  # fmt: skip
        await self.publish("lowpower", LowPowerEvent(node=NODE, owner=OWNER, using=False, devices=tuple(self.cards)))
        for card, container_id in zip(self.cards, containers, strict=True):
            self.node.allocated[f"spot/{container_id}"] = {"c0": {"gpushare/spot-gpu": (f"spot-{card}",)}}
            await self.publish("spot", SpotEvent(node=NODE, pod=f"spot/{container_id}", container="c0",
                                                 state="using", devices=(f"spot-{card}",)))  # fmt: skip
        if not await self.until(lambda: self.borrowers() == len(self.cards), STEP_TIMEOUT_S):
            raise TimeoutError(f"the solver did not record the borrowers within {STEP_TIMEOUT_S:.0f} s")

    async def prepare(self) -> list[str]:
        """Borrowers on the owner's cards, the owner away and watched: ready for its call."""
        self.number += 1
        containers = [f"t{self.number}-{i}" for i in range(len(self.cards))]
        try:
            await self.lend(containers)
            await detect_ready(self.bus, OWNER, timeout=STEP_TIMEOUT_S)
        except BaseException:
            await self.clean(containers)
            raise
        return containers

    async def owner_back(self, containers: list[str]) -> TrialResult:
        """The owner's call; how long it was held; when containerd saw the last borrower exit."""
        exits: list[float] = []

        async def wait_exit(container_id: str) -> None:
            await self.tasks.wait(container_id, STEP_TIMEOUT_S)
            exits.append(time.monotonic())

        waiters = [asyncio.ensure_future(wait_exit(c)) for c in containers]
        await asyncio.sleep(0.05)  # let the Wait calls reach containerd before the clock starts
        at = time.monotonic()
        try:
            held, _ = await owner_ioctl(self.hook, self.pidns, self.pid)
            await asyncio.wait_for(asyncio.gather(*waiters), STEP_TIMEOUT_S)
            if not await self.until(lambda: self.borrowers() == 0, STEP_TIMEOUT_S):
                raise TimeoutError("the solver still records borrowers after the borrowers exited")
            return TrialResult(held, at, True, dead_ms=(max(exits) - at) * 1000)
        except (TimeoutError, OSError, ValueError, ContainerdError) as err:
            return TrialResult(float("nan"), at, False, f"{type(err).__name__}: {err}")
        finally:
            for waiter in waiters:
                waiter.cancel()
            await self.clean(containers)

    async def trial(self, before_call: Callable[[], None] | None = None) -> TrialResult:
        """One owner-back (``before_call`` runs just before the owner's call); a failure on the
        way is a result too, with its error. ``before_call`` runs either way: a fault it injects
        (a server killed) happens even when the borrowers could not be made ready."""
        try:
            containers = await self.prepare()
        except (TimeoutError, BusError, Stopped, KubeError, ContainerdError, OSError, RuntimeError) as err:
            if before_call is not None:
                before_call()
            return TrialResult(float("nan"), time.monotonic(), False, f"{type(err).__name__}: {err}")
        if before_call is not None:
            before_call()
        return await self.owner_back(containers)

    async def clean(self, containers: list[str]) -> None:
        await asyncio.gather(*(remove_container(self.node, c) for c in containers))
        for container_id in containers:
            self.node.allocated.pop(f"spot/{container_id}", None)


@contextlib.contextmanager
def kernel_and_bridge(node: Node, env: dict[str, str], work: Path) -> Iterator[Path]:
    """The kernel stand-in and the real kmod-bridge; yields the stand-in's hook socket."""
    kmod, hook = work / "kmod.sock", work / "hook.sock"
    with process([sys.executable, "-m", "gpushare_sim.kernel", "--socket", str(kmod), "--hook-socket", str(hook),
                  "--timeout-ms", str(KERNEL_TIMEOUT_MS)], log=work / "kernel.log"):  # fmt: skip
        deadline = time.monotonic() + 20
        while not (kmod.exists() and hook.exists()):
            if time.monotonic() > deadline:
                raise RuntimeError("the kernel stand-in did not start")
            time.sleep(0.05)
        with process([sys.executable, "-m", "gpushare_kmod_bridge"], {**_bridge_env(node, kmod), **env},
                     log=work / "kmod-bridge.log"):  # fmt: skip
            yield hook


async def _ready(node: Node, solver: object) -> None:
    deadline = time.monotonic() + 60
    while not await asyncio.to_thread(node.ready):
        if getattr(solver, "returncode", None) is not None or time.monotonic() > deadline:
            raise RuntimeError("the solver did not become ready (see solver.log)")
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def real_node(cluster: NatsTarget, layout: Layout, logs: Path, cards: int) -> AsyncIterator[RealNode]:
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-node-"))
    env = nats_env(cluster, layout)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, work, True)
        async with _started(cluster, layout, logs, cards, work, env) as real:
            yield real


@contextlib.asynccontextmanager
async def _started(cluster: NatsTarget, layout: Layout, logs: Path, cards: int, work: Path,
                   env: dict[str, str]) -> AsyncIterator[RealNode]:  # fmt: skip
    with Containerd() as ctrd, process([sys.executable, "-m", "gpushare_sim.apiserver", "--port", "0",
                                        "--kubeconfig", str(work / "kubeconfig")], log=logs / "apiserver.log") as api:
        _wait_file(work / "kubeconfig", api, "API emulator")
        for namespace in ("dev", "spot"):
            await asyncio.to_thread(ensure_namespace, work / "kubeconfig", namespace)
        node = Node(cluster.url, work / "kubeconfig", ctrd, make_rootfs(work / "rootfs"), work,
                    work / "pod-resources.sock")
        async with serve_pod_resources(node.pod_resources) as kubelet:  # confirms every eviction
            node.allocated = kubelet.table
            with process([sys.executable, "-m", "gpushare_solver"], {**solver_env(node), **env},
                         log=logs / "solver.log") as solver, kernel_and_bridge(node, env, work) as hook:  # fmt: skip
                node.http_port = await asyncio.to_thread(http_port, work, solver)
                await _ready(node, solver)
                async with contextlib.AsyncExitStack() as stack:
                    settings = cluster.settings(prefix=layout.prefix, stream=layout.stream, kv_prefix=layout.kv_prefix)
                    bus = Bus(settings, "bench")
                    await bus.connect()
                    stack.push_async_callback(bus.drain)
                    kube = Kube(KubeSettings(kubeconfig=str(node.kubeconfig)))
                    stack.push_async_callback(kube.close)
                    tasks = await stack.enter_async_context(Tasks(str(ctrd.address), NAMESPACE))
                    owner = start_owner(node)
                    await kube.create_pod("dev", pod_body("owner", NODE, [OWNER_CONTAINER]))
                    real = RealNode(node, bus, kube, tasks, hook, owner, cards)
                    await real.publish("generic", ReservedEvent(node=NODE, pod=OWNER, container="c0", state="using",
                                                               vendor_resource="nvidia.com/gpu",
                                                               devices=tuple(real.cards)))  # fmt: skip
                    yield real
