"""What every scenario uses: the API client, the bus, pod bodies, waits, narration.

A scenario is ``async def scenario(s: Scenario) -> str`` (the returned text is
its one-line summary); it raises :class:`ScenarioError` (or a timeout) when
the system does not do what it should. Each scenario works in its own
namespace; :func:`play` deletes what is left there afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, overload

from gpushare_common import events
from gpushare_common.adapters.kube import KubeError, NotFound, Retryable
from gpushare_common.bus import Bus, BusError, Transient
from gpushare_common.retry import retry

from gpushare_sim.node.adapters.kube import SimKube
from gpushare_sim.run.cluster import Cluster
from gpushare_sim.run.evidence import keep_evidence
from gpushare_sim.run.kubeapi import ensure_namespace
from gpushare_sim.run.narrate import Timeline

T = TypeVar("T")
Obj = dict[str, Any]
GPU = "nvidia.com/gpu"
SHADOW_SELECTOR = "gpushare.k8s.io/pod-description=shadow-pod"
SYSTEM_NAMESPACE = "gpushare-system"  # where the shadow-controller makes every ShadowPod
# every container lists its device nodes (name major,minor) into its report directory, then waits
LIST_DEVICES = ["sh", "-c", "ls -l /dev > /run/gpuload/devs; exec sleep 3600"]


class ScenarioError(AssertionError):
    """The system did not do what the scenario expects; the message says what and where."""


class PodFailed(ScenarioError):
    """A pod waited for ended Failed; ``status`` is its status as the API has it."""

    def __init__(self, pod: str, status: Obj) -> None:
        self.pod, self.status = pod, status
        super().__init__(f"pod {pod} failed: {status}")

    @property
    def reason(self) -> str:
        return str(self.status.get("reason", ""))


@dataclass
class Scenario:
    name: str
    cluster: Cluster
    timeline: Timeline
    kube: SimKube  # the typed calls, and any object (resource.k8s.io) through the same client
    bus: Bus  # the cluster's NATS, as the installer: what reaches the cluster from every node
    evictions: list[events.EvictionRecord] = field(default_factory=list)
    owner_backs: list[events.OwnerBackEvent] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)  # ShadowPods seen
    warnings: list[str] = field(default_factory=list)
    leaves: dict[str, Bus] = field(default_factory=dict)  # node -> its leaf server, as its installer
    since: dict[str, int] = field(default_factory=dict)  # node -> its stream's last sequence at the start

    @property
    def namespace(self) -> str:
        return self.name

    async def on(self, node: str) -> Bus:
        """The NATS of ``node``: its leaf server (its stream, its buckets, its subjects), as that
        leaf's installer; connected at first use, closed when the scenario's recording ends."""
        if node not in self.leaves:
            bus = Bus(self.cluster.leaf(node).settings(), "installer")
            await bus.connect()
            self.leaves[node] = bus
        return self.leaves[node]

    def say(self, text: str, **keys: object) -> None:
        self.timeline.step(f"[{self.name}] {text}", **keys)

    def warn(self, text: str, **keys: object) -> None:
        """Something worth knowing that does not fail the scenario (listed in the summary)."""
        self.warnings.append(text)
        self.say(f"WARNING: {text}", **keys)

    def hop(self, name: str, seconds: float) -> None:
        self.timeline.hop(self.name, name, seconds)

    # --- pods -------------------------------------------------------------

    async def create(self, body: Obj) -> Obj:
        return await self.kube.create_pod(self.namespace, body)

    async def pod(self, name: str) -> Obj | None:
        try:
            return await self.kube.get_pod(self.namespace, name)
        except NotFound:
            return None

    async def pods(self, label_selector: str = "") -> list[Obj]:
        items, _ = await self.kube.list_pods(self.namespace, label_selector=label_selector)
        return items

    async def shadow_pods(self, alive: bool = True) -> list[Obj]:
        """The ShadowPods (all in the system namespace, shared by every tenant)."""
        found, _ = await self.kube.list_pods(SYSTEM_NAMESPACE, label_selector=SHADOW_SELECTOR)
        return [p for p in found if not alive or not p["metadata"].get("deletionTimestamp")]

    async def shadow_pod(self, name: str) -> Obj | None:
        try:
            return await self.kube.get_pod(SYSTEM_NAMESPACE, name)
        except NotFound:
            return None

    async def delete(self, name: str, namespace: str = "") -> None:
        try:
            await self.kube.delete_pod(namespace or self.namespace, name, grace_seconds=0)
        except NotFound:
            return

    async def delete_shadow(self, name: str) -> None:
        await self.delete(name, SYSTEM_NAMESPACE)

    async def _seen(self, name: str) -> tuple[bool, Obj | None]:
        """(answered, the pod): an API that is restarting has not answered yet (a wait goes on)."""
        try:
            return True, await self.pod(name)
        except Retryable:
            return False, None

    async def wait_running(self, name: str, timeout: float = 60.0) -> Obj:
        async def probe() -> Obj | None:
            _, pod = await self._seen(name)
            if pod is not None and phase(pod) == "Failed":
                raise PodFailed(f"{self.namespace}/{name}", pod.get("status") or {})
            return pod if pod is not None and phase(pod) == "Running" else None

        return await wait_until(probe, timeout, f"pod {self.namespace}/{name} Running", self.cluster)

    async def wait_gone(self, name: str, timeout: float = 60.0) -> None:
        async def probe() -> bool:
            answered, pod = await self._seen(name)
            return answered and pod is None

        await wait_until(probe, timeout, f"pod {self.namespace}/{name} gone", self.cluster)

    def node_dir(self, pod: Obj) -> Path:
        return self.cluster.run_dir / str(pod["spec"].get("nodeName", ""))

    async def devices_seen(self, name: str, container: str = "main", timeout: float = 30.0) -> list[str]:
        """The GPU device nodes inside a running container: ``<node>/nvidiaN=major,minor`` each."""
        pod = await self.wait_running(name, timeout)
        path = self.node_dir(pod) / "util" / self.namespace / name / container / "devs"
        text = await wait_until(lambda: _read(path), timeout, f"{name}/{container} device list", self.cluster)
        return [f"{pod['spec'].get('nodeName', '')}/{device}" for device in gpu_devices(text)]


def phase(pod: Obj | None) -> str:
    return str(((pod or {}).get("status") or {}).get("phase", ""))


def gpu_devices(ls_output: str) -> list[str]:
    """``nvidiaN=major,minor`` for each GPU device node in ``ls -l /dev`` output."""
    found = []
    for line in ls_output.splitlines():
        parts = line.replace(",", " , ").split()
        if not parts or not parts[0].startswith("c") or not parts[-1].startswith("nvidia"):
            continue
        if parts[-1] in ("nvidiactl", "nvidia-uvm") or "," not in parts:
            continue
        comma = parts.index(",")
        major, minor = parts[comma - 1], parts[comma + 1]
        if major.isdigit() and minor.isdigit():
            found.append(f"{parts[-1]}={major},{minor}")
    return sorted(found)


def _read(path: Path) -> str | None:
    try:
        return path.read_text() or None
    except OSError:
        return None


def container(name: str, command: list[str] | None = None, limits: dict[str, str] | None = None) -> Obj:
    body: Obj = {"name": name, "image": "busybox", "resources": {"limits": dict(limits or {})}}
    if command:
        body["command"] = command
    return body


def pod_body(name: str, containers: list[Obj], annotations: dict[str, str] | None = None,
             labels: dict[str, str] | None = None) -> Obj:  # fmt: skip
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {}), "labels": dict(labels or {})},
        "spec": {"containers": containers, "restartPolicy": "Never", "terminationGracePeriodSeconds": 0},
    }  # fmt: skip


@overload
async def wait_until(probe: Callable[[], Awaitable[T | None]], timeout: float, what: str,
                     cluster: Cluster | None = None, interval: float = 0.05) -> T: ...  # fmt: skip
@overload
async def wait_until(probe: Callable[[], T | None], timeout: float, what: str,
                     cluster: Cluster | None = None, interval: float = 0.05) -> T: ...  # fmt: skip
async def wait_until(probe: Callable[[], Any], timeout: float, what: str,
                     cluster: Cluster | None = None, interval: float = 0.05) -> Any:  # fmt: skip
    """Poll ``probe`` (sync or async) until it returns something truthy; a clear TimeoutError
    naming ``what``. Fails at once when a part of ``cluster`` died meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        value: Any = probe()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if cluster is not None:
            cluster.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


# --- running scenarios -----------------------------------------------------------

SCENARIOS: dict[str, Callable[[Scenario], Awaitable[str]]] = {}


NEEDS_CONTAINERS: set[str] = set()


class Skipped(Exception):
    """The scenario cannot run on this cluster (the message says why)."""


def scenario(
    name: str, containers: bool = True
) -> Callable[[Callable[[Scenario], Awaitable[str]]], Callable[[Scenario], Awaitable[str]]]:
    """Register a scenario; ``containers``: it needs real containers (the gpushare runtime copies
    devices, the kernel stand-in tells pid namespaces apart), so plain-process nodes skip it."""

    def register(fn: Callable[[Scenario], Awaitable[str]]) -> Callable[[Scenario], Awaitable[str]]:
        SCENARIOS[name] = fn
        if containers:
            NEEDS_CONTAINERS.add(name)
        return fn

    return register


async def open_clients(cluster: Cluster, stack: AsyncExitStack) -> tuple[SimKube, Bus]:
    kube = SimKube.from_kubeconfig(str(cluster.kubeconfig))
    stack.push_async_callback(kube.close)
    bus = Bus(cluster.nats_settings(), "installer")  # the scenarios also feed malformed input
    await bus.connect()
    stack.push_async_callback(bus.drain)
    return kube, bus


@asynccontextmanager
async def recording(s: Scenario) -> AsyncIterator[Scenario]:
    """Collect eviction records and owner-back events into ``s`` from each node's event stream on
    its leaf server (what the stream stored, so no NATS restart or outage loses anything of it);
    empty the namespace after."""
    start = {node.name: await retry((await s.on(node.name)).last_seq, (Transient,), "read the event stream",
                                    deadline_s=30) for node in s.cluster.nodes}  # fmt: skip
    s.since = dict(start)
    stop = asyncio.Event()
    follower = asyncio.ensure_future(_follow(s, start, stop))
    try:
        yield s
    finally:
        # the event as well as the cancellation: a cancellation can be lost inside a read (on
        # Python 3.11 asyncio.wait_for returns the reply that came in the same turn, as nats-py's
        # request waits with it), and the follower would then read on forever
        stop.set()
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        try:
            await clean_namespace(s)
        finally:
            for bus in s.leaves.values():
                await bus.drain()
            s.leaves.clear()


async def _follow(s: Scenario, after: dict[str, int], stop: asyncio.Event, every_s: float = 0.05) -> None:
    """Each node's eviction records and owner-backs (a node added meanwhile: from its start)."""
    cursors: dict[tuple[str, str], int] = {}
    while not stop.is_set():
        for node in [n.name for n in s.cluster.nodes]:
            bus = await s.on(node)
            for subject in (bus.subjects.eviction(node), bus.subjects.event(node, "ownerback")):
                seq = cursors.setdefault((node, subject), after.get(node, 0))
                cursors[node, subject] = await _collect_after(s, bus, subject, seq)
        await asyncio.sleep(every_s)


async def _collect_after(s: Scenario, bus: Bus, subject: str, after: int) -> int:
    """Collect what the stream holds on ``subject`` after ``after``; the last sequence read."""
    try:
        found = await bus.read_after(subject, after)
    except BusError as err:  # the leaf restarting: read on from the same place
        s.timeline.step(f"[{s.name}] event stream unreadable for now", subject=subject, error=str(err))
        await asyncio.sleep(0.5)
        return after
    for message in found:
        with contextlib.suppress(events.EventDecodeError):  # the badinput scenario's own input
            _collect(s, message.event())
        after = message.seq
    return after


async def run_scenario(s: Scenario) -> str:
    """Play one scenario (its summary line, or its error raised); its namespace is emptied after."""
    s.timeline.step(f"=== scenario {s.name}")
    await asyncio.to_thread(ensure_namespace, s.cluster.kubeconfig, s.namespace)
    async with recording(s):
        if s.name in NEEDS_CONTAINERS and not all(n.containerd for n in s.cluster.nodes):
            raise Skipped("needs real containers (root, containerd, runc): the nodes run plain processes")
        return await SCENARIOS[s.name](s)


async def play_one(name: str, cluster: Cluster, timeline: Timeline, kube: SimKube, bus: Bus) -> bool:
    s = Scenario(name, cluster, timeline, kube, bus)
    started = time.monotonic()
    try:
        detail = await run_scenario(s)
    except Skipped as why:
        timeline.result(name, True, time.monotonic() - started, str(why), skipped=True)
        return True
    except Exception as err:  # a failed scenario is reported; the others still run
        timeline.result(name, False, time.monotonic() - started, f"{type(err).__name__}: {err}")
        keep_evidence(cluster.run_dir / "logs", f"run-{name}")
        return False
    warned = "; ".join(f"WARNING: {w}" for w in s.warnings)
    timeline.result(name, True, time.monotonic() - started, f"{detail}; {warned}" if warned else detail)
    return True


def _collect(s: Scenario, event: events.AnyEvent) -> None:
    if isinstance(event, events.EvictionRecord):
        s.evictions.append(event)
    elif isinstance(event, events.OwnerBackEvent):
        s.owner_backs.append(event)


async def clean_namespace(s: Scenario) -> None:
    """Delete every pod left in the scenario's namespace, and the ShadowPods it caused, and wait
    until they are gone."""
    try:
        for pod in await s.pods():
            await s.delete(pod["metadata"]["name"])
        for pod in await s.shadow_pods(alive=False):
            await s.delete_shadow(pod["metadata"]["name"])
        await wait_until(lambda: _none_left(s), 60, f"namespace {s.namespace} empty")
    except (KubeError, TimeoutError) as err:
        s.say(f"clean-up incomplete: {err}")


async def _none_left(s: Scenario) -> bool:
    return not await s.pods() and not await s.shadow_pods(alive=False)


async def play(cluster: Cluster, timeline: Timeline, names: list[str]) -> bool:
    """Play ``names`` in order on a running cluster; True when every one passed."""
    if not names:
        return True
    async with AsyncExitStack() as stack:
        kube, bus = await open_clients(cluster, stack)
        results = [await play_one(name, cluster, timeline, kube, bus) for name in names]
    return all(results)
