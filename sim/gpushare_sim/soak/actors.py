"""What comes and goes during a soak: owners that go away and come back with borrowers on their
cards, SharePods, and the faults. Every choice comes from a seeded random source, so a seed
replays the same decisions (the timing is the machine's)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare_common import events
from gpushare_common.adapters.containerd import ContainerdClient, ContainerdError
from gpushare_common.adapters.kube import Conflict, KubeError, Retryable
from gpushare_common.retry import Stopped, retry

from gpushare_sim.scenarios.kit import GPU, PodFailed, Scenario, container, pod_body, wait_until
from gpushare_sim.scenarios.spot import LENDABLE, OWNER_LOOP, pinned
from gpushare_sim.soak.checks import Checks, ask_kernel
from gpushare_sim.soak.faults import Fault, Faults

API_RETRY_S = 60.0  # an API restart (a soak fault) heals within this; a pod write waits it out

SPOT = "gpushare/spot-gpu"
LIST = "ls -l /dev > /run/gpuload/devs; "


@dataclass
class Figures:
    owner_back_ms: list[float] = field(default_factory=list)  # the owner's call held, in the kernel
    evicted_ms: list[float] = field(default_factory=list)  # the owner's ioctl -> borrower's tasks dead
    recovery_s: dict[str, list[float]] = field(default_factory=dict)  # fault kind -> seconds to ready
    counts: dict[str, int] = field(default_factory=dict)

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1


@dataclass
class Soak:
    s: Scenario
    checks: Checks
    rng: random.Random
    deadline: float
    slow_share: float = 0.5
    borrower_mib: int = 1024
    figures: Figures = field(default_factory=Figures)
    serial: int = 0
    sharing: dict[str, tuple[str, float]] = field(default_factory=dict)  # SharePod -> (node, created)

    def done(self) -> bool:
        return time.monotonic() >= self.deadline

    def name(self, stem: str) -> str:
        self.serial += 1
        return f"{stem}-{self.serial}"

    def say(self, text: str, **keys: object) -> None:
        self.s.say(text, **keys)


# --- owners and borrowers ---------------------------------------------------------------


async def owner_cycles(soak: Soak, node: str, rng: random.Random) -> None:
    """A dev machine on ``node`` goes away; a borrower lands; the owner comes back; again."""
    owner = f"owner-{node}"
    await create(soak, pinned(pod_body(owner, [container("main", ["sh", "-c", OWNER_LOOP], {GPU: "1"})],
                                        labels=LENDABLE), node))  # fmt: skip
    card = (await soak.s.devices_seen(owner, timeout=120))[0]
    report_dir = soak.s.node_dir(await soak.s.wait_running(owner)) / "util" / soak.s.namespace / owner / "main"
    while not soak.done():
        try:
            await one_borrower(soak, node, owner, card, report_dir, rng)
        except (TimeoutError, KubeError, Stopped) as err:
            soak.figures.count(f"borrower-cycles-abandoned ({_why(err)})")
            soak.say(f"borrower cycle on {node} abandoned: {str(err)[:200]}")
            print(f"soak: borrower cycle on {node} abandoned: {str(err)[:200]}", flush=True)
            await asyncio.sleep(rng.uniform(1.0, 3.0))  # the API may be restarting


async def one_borrower(soak: Soak, node: str, owner: str, card: str, report_dir: Path,
                       rng: random.Random) -> None:  # fmt: skip
    borrower = soak.name("borrower")
    slow = rng.random() < soak.slow_share
    command = LIST + (f"exec hog --mib {soak.borrower_mib} --threads 64 --child" if slow else "exec sleep 3600")
    soak.checks.borrowers.add(f"{soak.s.namespace}/{borrower}")
    known = len(soak.s.evictions)
    await create(soak, pinned(pod_body(borrower, [container("main", ["sh", "-c", command], {SPOT: "1"})]), node))
    try:
        seen = await devices_unless_evicted(soak, borrower, known)
    except TimeoutError:
        await delete(soak, borrower)
        raise
    except PodFailed as failed:
        if failed.reason != "UnexpectedAdmissionError":
            raise
        # the spot device it was scheduled to was withdrawn before the kubelet admitted it (a
        # ShadowPod reserved the card, or a container still held it): Kubernetes fails such a pod,
        # as it does any pod whose device went away between scheduling and admission; next one
        soak.figures.count("borrowers-refused-at-admission (device withdrawn)")
        await delete(soak, borrower)
        return
    if isinstance(seen, events.EvictionRecord):  # its card was taken back before it ran (a ShadowPod
        soak.figures.count(f"borrowers-evicted-before-running ({seen.reason})")  # reserved it): next one
        await soak.s.wait_gone(borrower, 60)
        return
    if seen != [card]:  # it borrowed a free card: it simply leaves after a while
        soak.figures.count("borrowers-on-free-cards")
        await asyncio.sleep(rng.uniform(1.0, 5.0))
        await delete(soak, borrower)
        await soak.s.wait_gone(borrower, 60)
        return
    await asyncio.sleep(rng.uniform(0.0, 3.0))
    early = _evicted(soak, borrower, known)
    if early is not None:  # evicted while it ran, before its owner came back (a ShadowPod reserved the card)
        soak.figures.count(f"borrowers-evicted-before-the-owner ({early.reason})")
        await soak.s.wait_gone(borrower, 60)
        return
    await owner_back(soak, node, owner, borrower, report_dir, slow)


async def devices_unless_evicted(soak: Soak, borrower: str, known: int,
                                 timeout: float = 120.0) -> list[str] | events.EvictionRecord:
    """The borrower's devices once it runs, or its eviction record when it is evicted first."""
    seen = asyncio.ensure_future(soak.s.devices_seen(borrower, timeout=timeout))
    evicted = asyncio.ensure_future(wait_until(lambda: _evicted(soak, borrower, known), timeout,
                                               f"eviction of {borrower}"))
    try:
        await asyncio.wait({seen, evicted}, return_when=asyncio.FIRST_COMPLETED)
        if evicted.done() and not evicted.cancelled() and evicted.exception() is None:
            return evicted.result()
        return await seen
    finally:
        for task in (seen, evicted):
            task.cancel()
        await asyncio.gather(seen, evicted, return_exceptions=True)


async def owner_back(soak: Soak, node: str, owner: str, borrower: str, report_dir: Path, slow: bool) -> None:
    """The owner touches its card with the borrower on it; the guard checks the release."""
    (owner_ns, _), (borrower_ns, borrower_pid) = await pid_namespace(soak, owner), await pid_namespace(soak, borrower)
    hook = str(next(n for n in soak.s.cluster.nodes if n.name == node).hook_socket)
    if owner_ns and borrower_ns:
        await ask_kernel(hook, {"op": "guard", "owner": owner_ns, "borrowers": [borrower_ns], "pids": [borrower_pid]})
    known = len(soak.s.evictions)
    _go(report_dir)
    try:
        record = await wait_until(lambda: _evicted(soak, borrower, known), 120, f"eviction of {borrower}")
    except TimeoutError:  # the owner touched its card with a borrower on it: an owner-back was lost
        soak.checks.fail("owner-back", f"{node}: no eviction of {borrower} within 120 s of its owner's call")
        raise
    held = await wait_until(lambda: _held_ms(report_dir), 120, f"{owner}'s call to return")
    soak.figures.owner_back_ms.append(held)
    soak.figures.evicted_ms.append(record.tasks_dead_ms)
    soak.figures.count("owner-backs-slow-borrower" if slow else "owner-backs")
    await soak.s.wait_gone(borrower, 120)


async def pid_namespace(soak: Soak, name: str) -> tuple[int, int]:
    """The pid namespace of a pod's first container and its init process (its task's pid, from
    the node's containerd), (0, 0) when not found."""
    pod = await soak.s.pod(name)
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
    runtime_id = str(statuses[0].get("containerID", "")) if statuses else ""
    node = next((n for n in soak.s.cluster.nodes if n.name == (pod or {}).get("spec", {}).get("nodeName")), None)
    if node is None or "://" not in runtime_id or not node.containerd:
        return 0, 0
    address, namespace = node.endpoints["containerd_address"], node.endpoints["containerd_namespace"]
    try:
        async with ContainerdClient(address, namespace) as containerd:
            pid = await containerd.pid(runtime_id.split("://", 1)[1])
    except ContainerdError:
        return 0, 0
    return _pidns(pid)


def _pidns(pid: int) -> tuple[int, int]:
    try:
        return (Path(f"/proc/{pid}/ns/pid").stat().st_ino, pid) if pid > 0 else (0, 0)
    except OSError:
        return 0, 0


async def create(soak: Soak, body: dict[str, Any]) -> None:
    """Create a pod, again across an API restart (a create that did land is not made twice)."""
    async def attempt() -> None:
        with contextlib.suppress(Conflict):
            await soak.s.create(body)

    await retry(attempt, (Retryable,), f"create pod {body['metadata']['name']}", deadline_s=API_RETRY_S)


async def delete(soak: Soak, name: str) -> None:
    """Delete a pod, again across an API restart."""
    await retry(lambda: soak.s.delete(name), (Retryable,), f"delete pod {name}", deadline_s=API_RETRY_S)


def _why(err: Exception) -> str:
    """A short name for why a cycle was abandoned: what it waited for, or the API's error."""
    if isinstance(err, KubeError | Stopped):
        return "api"
    return re.sub(r"\b(?:borrower|owner)-[\w-]+", "<pod>", str(err).split("waiting for ", 1)[-1])[:60]


def _go(report_dir: Path) -> None:
    """Tell the owner's workload to make one GPU call (its last report removed first)."""
    for report in report_dir.glob("nvidia*.json"):
        report.unlink(missing_ok=True)
    (report_dir / "go").touch()


def _evicted(soak: Soak, borrower: str, known: int) -> events.EvictionRecord | None:
    key = f"{soak.s.namespace}/{borrower}"
    return next((r for r in soak.s.evictions[known:] if r.pod == key and r.outcome == "evicted"), None)


def _held_ms(report_dir: Path) -> float | None:
    for report in report_dir.glob("nvidia*.json"):
        try:
            return float(json.loads(report.read_text()).get("blocked_ms", 0.0))
        except (OSError, ValueError):
            continue
    return None


# --- SharePods ---------------------------------------------------------------------------


async def share_churn(soak: Soak, rng: random.Random, per_node: int = 3) -> None:
    """SharePods of random specs come and go on random nodes, at most ``per_node`` at once (the
    node's cards besides the owner's hold that many ShadowPods: each must get to run)."""
    live: dict[str, tuple[str, float]] = soak.sharing
    while not soak.done():
        await asyncio.sleep(rng.uniform(1.0, 4.0))
        node = rng.choice(soak.s.cluster.nodes).name
        if live and (rng.random() < 0.4 or sum(n == node for n, _ in live.values()) >= per_node):
            name = rng.choice(sorted(live))
            del live[name]
            with contextlib.suppress(KubeError, Stopped):
                await delete(soak, name)
            continue
        name = soak.name("share")
        resource = rng.choice(["gpushare/share-gpu-2", "gpushare/share-gpu-4"])
        soak.checks.sharers.add(f"{soak.s.namespace}/{name}")
        try:
            await create(soak, pinned(pod_body(name, [container("app", ["sh", "-c", "exec sleep 3600"],
                                                                 {resource: "1"})]), node))  # fmt: skip
        except (KubeError, Stopped) as err:  # the API restarting for longer than API_RETRY_S
            soak.say(f"SharePod {name} not created: {str(err)[:200]}")
            continue
        live[name] = (node, time.monotonic())
        soak.figures.count("share-pods")


# --- faults ------------------------------------------------------------------------------


async def fault_schedule(soak: Soak, faults: Faults, rng: random.Random, every_s: float,
                         bound_s: float, kinds: tuple[str, ...], regular: bool = False) -> None:  # fmt: skip
    """A fault every ``every_s`` on average (``regular``: exactly), each after the last healed;
    each must heal within ``bound_s``."""
    from gpushare_sim.soak.faults import choose

    while not soak.done():
        await asyncio.sleep(every_s if regular else rng.expovariate(1.0 / every_s))
        if soak.done():
            return
        fault: Fault = choose(rng, soak.s.cluster, kinds)
        soak.say(f"fault: {fault}", hold_s=round(fault.hold_s, 2))
        try:
            healed = await asyncio.wait_for(faults.inject(fault), bound_s + fault.hold_s + 30)
        except (TimeoutError, OSError) as err:
            soak.checks.fail("recovery", f"{fault}: not ready again ({err!r})")
            continue
        soak.figures.recovery_s.setdefault(fault.kind, []).append(healed)
        soak.figures.count(f"fault {fault.kind}")
        if healed > bound_s:
            soak.checks.fail("recovery", f"{fault}: ready again after {healed:.1f}s (bound {bound_s:.0f}s)")
