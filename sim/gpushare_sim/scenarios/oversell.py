"""Scenario 6, overselling: oversold data tasks evicted under memory pressure, in the right order.

A training pod holds every card of the node. Three CPU-only data tasks ask
for ``gpushare/vmem`` (spare memory advertised as devices of 256 MiB) with
different priorities and creation times. Then the node's memory use rises to
80% (threshold 70%): the solver evicts the data tasks lowest priority first,
then newest first, and stops as soon as its estimate is back under the
threshold: two of the three go, the high-priority one stays.

The pressure is the detector's own computation over files, not a made-up
event: for the length of the scenario the detector reads a cgroup v2-shaped
tree (``kubepods.slice/.../memory.current``, ``memory.stat``, ``cpu.stat``
per pod) and a ``/proc`` stand-in (``meminfo``, ``stat``) that the scenario
writes, as the kernel would on a real node.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from gpushare_common import events
from gpushare_common.settings import env_of
from gpushare_detector import settings as detector
from gpushare_deviceplugin import settings as deviceplugin
from gpushare_solver import settings as solver

from gpushare_sim.run.procs import Child, http_json
from gpushare_sim.scenarios.kit import (
    GPU,
    LIST_DEVICES,
    Obj,
    Scenario,
    ScenarioError,
    container,
    pod_body,
    scenario,
    wait_until,
)  # fmt: skip

GIB = 1 << 30
VMEM = "gpushare/vmem"
VMEM_UNIT = 256 << 20
MEMORY_TOTAL = 16 * GIB
SYSTEM_MEMORY = 1843 << 20  # 1.8 GiB used outside any pod
TRAINER_MEMORY = 8 * GIB
THRESHOLD = 0.70  # the solver's default memory threshold
KEEP = frozenset({"deviceplugin"})  # services left with the scenario's settings
COOLDOWN_S = 5.0  # the solver's pause after a pressure eviction (30 s by default)
TASK_DEVICES = 4  # each data task asks for 4 x 256 MiB
STARTED, GROWN = GIB // 4, GIB  # a data task's working set when it starts, and once it grew
# (name, priority), in creation order: expected eviction data-3 (0, newest), data-1 (0), keep data-2 (100)
DATA_TASKS = (("data-1", 0), ("data-2", 100), ("data-3", 0))
EXPECTED_EVICTED = ("data-3", "data-1")


class NodeFiles:
    """The node's cgroup v2 tree (systemd layout) and ``/proc`` stand-in; files replaced atomically."""

    def __init__(self, root: Path, cpus: int = 8) -> None:
        self.root, self.cgroup, self.proc = root, root / "cgroup", root / "proc"
        self.cpus = cpus
        self.pods: dict[str, int] = {}  # pod uid -> working set

    @property
    def memory_used(self) -> int:
        return SYSTEM_MEMORY + sum(self.pods.values())

    def set_pod(self, pod: Obj, memory: int) -> None:
        self.pods[str(pod["metadata"]["uid"])] = memory

    def remove_pod(self, pod: Obj) -> None:
        """The pod's cgroup goes away (as the kubelet removes it); :meth:`write` updates the node."""
        uid = str(pod["metadata"]["uid"])
        self.pods.pop(uid, None)
        shutil.rmtree(self.pod_dir(uid), ignore_errors=True)

    def pod_dir(self, uid: str) -> Path:
        qos = self.cgroup / "kubepods.slice" / "kubepods-burstable.slice"
        return qos / f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"

    def write(self) -> None:
        """Pods first, then the node's totals (what a reader sees between is at worst a pod early)."""
        _put(self.cgroup / "cgroup.controllers", "cpuset cpu io memory pids\n")
        for uid, memory in self.pods.items():
            directory = self.pod_dir(uid)
            _put(directory / "memory.current", f"{memory}\n")
            _put(directory / "memory.stat", f"anon {memory}\nfile 0\ninactive_file 0\nactive_file 0\n")
            _put(directory / "memory.max", "max\n")
            _put(directory / "cpu.stat", "usage_usec 0\nuser_usec 0\nsystem_usec 0\n")
        free_kb = (MEMORY_TOTAL - self.memory_used) // 1024
        _put(self.proc / "meminfo", f"MemTotal: {MEMORY_TOTAL // 1024} kB\nMemFree: {free_kb} kB\n"
                                    f"MemAvailable: {free_kb} kB\n")  # fmt: skip
        cpu = "0 0 0 100000 0 0 0 0 0 0"  # idle: no CPU pressure
        _put(self.proc / "stat", "\n".join([f"cpu  {cpu}", *(f"cpu{i} {cpu}" for i in range(self.cpus))]) + "\n")


def _put(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.new")
    partial.write_text(text)
    partial.replace(path)


@asynccontextmanager
async def reconfigured(s: Scenario, settings: dict[str, dict[str, str]],
                       keep: frozenset[str] = frozenset()) -> AsyncIterator[None]:  # fmt: skip
    """Restart the node's services whose settings change; as they were after, except ``keep``."""
    changed: list[tuple[Child, dict[str, str]]] = []
    try:
        for service, extra in settings.items():
            child = s.cluster.service(service)
            if any(child.env.get(k) != v for k, v in extra.items()):
                changed += [] if service in keep else [(child, dict(child.env))]
                child.env.update(extra)
                await s.cluster.restart(child.name)
        yield
    finally:
        for child, env in changed:
            child.env.clear()
            child.env.update(env)
            await s.cluster.restart(child.name)


def oversell_settings(files: NodeFiles) -> dict[str, dict[str, str]]:
    """The device plugin advertises vcpu/vmem (left on after: the kubelet keeps a resource once
    registered); the detector samples the scenario's files twice a second; the solver starts
    afresh with a short cooldown (the scenario can be played again)."""
    return {
        "solver": env_of(solver.SolverSettings, solver.PREFIX, pressure_cooldown_s=COOLDOWN_S),
        "deviceplugin": env_of(deviceplugin.DevicePluginSettings, deviceplugin.PREFIX,
                               capacity_resources=("vcpu", "vmem")),
        "detector": env_of(detector.DetectorSettings, detector.PREFIX, cgroup_root=str(files.cgroup),
                           proc_root=str(files.proc), capacity_s=0.5),
    }  # fmt: skip


@asynccontextmanager
async def capacity_samples(s: Scenario, node: str) -> AsyncIterator[list[events.SpareCapacity]]:
    """Every ``gpushare/vmem`` SpareCapacity the detector publishes meanwhile."""
    seen: list[events.SpareCapacity] = []

    async def collect(event: events.AnyEvent) -> None:
        if isinstance(event, events.SpareCapacity):
            seen.append(event)

    sub = await s.bus.subscribe(s.bus.subjects.capacity(node, "vmem"), collect)
    try:
        yield seen
    finally:
        await sub.unsubscribe()


def spare_devices(ordinary: int) -> int:
    """What the detector must advertise: total - 10% margin - system use - ordinary pods' use."""
    return int((MEMORY_TOTAL * 0.9 - SYSTEM_MEMORY - ordinary) // VMEM_UNIT)


def data_task(name: str, priority: int) -> Obj:
    body = pod_body(name, [container("main", ["sleep", "3600"], {VMEM: str(TASK_DEVICES)})])
    body["spec"]["containers"][0]["resources"]["requests"] = {VMEM: str(TASK_DEVICES)}
    body["spec"]["priority"] = priority
    return body


async def advertised(s: Scenario, node: str, count: int) -> bool:
    allocatable = ((await s.kube.get_node(node)).get("status") or {}).get("allocatable") or {}
    return str(allocatable.get(VMEM, "")) == str(count)


def sample_with(samples: list[events.SpareCapacity], used: int) -> events.SpareCapacity | None:
    return next((e for e in samples if e.inputs.get("node_memory_used") == used), None)


def pressure_records(s: Scenario) -> list[events.EvictionRecord]:
    return [e for e in s.evictions if e.reason == "pressure"]


def _next_second(stamp: str) -> bool:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") != stamp


async def fill_cards(s: Scenario, files: NodeFiles, node: str) -> None:
    """A training pod takes every card; its 8 GiB leaves 18 devices of spare memory."""
    gpus = s.cluster.settings.gpus
    await s.create(pod_body("trainer", [container("main", LIST_DEVICES, {GPU: str(gpus)})]))
    cards = await s.devices_seen("trainer", timeout=90)
    if len(cards) != gpus:
        raise ScenarioError(f"the training pod should hold all {gpus} cards, sees {cards}")
    files.set_pod(await s.wait_running("trainer"), TRAINER_MEMORY)
    files.write()
    spare = spare_devices(TRAINER_MEMORY)
    await wait_until(lambda: advertised(s, node, spare), 30, f"{node} advertising {spare} {VMEM}", s.cluster)
    s.say(f"training pod holds all {gpus} cards and uses 8 GiB; the node advertises {spare} x 256 MiB of "
          f"{VMEM} (16 GiB - 10% margin - 1.8 GiB system - 8 GiB ordinary pods)")  # fmt: skip


async def start_data_tasks(s: Scenario, files: NodeFiles) -> dict[str, Obj]:
    """Create the data tasks one second apart (creation times differ), wait until they run."""
    stamp = ""
    for name, priority in DATA_TASKS:
        if stamp:
            await wait_until(partial(_next_second, stamp), 3, "the API's clock in the next second")
        stamp = (await s.create(data_task(name, priority)))["metadata"]["creationTimestamp"]
    running = {name: await s.wait_running(name) for name, _ in DATA_TASKS}
    for pod in running.values():
        files.set_pod(pod, STARTED)
    files.write()
    s.say("three data tasks run on the node, each with 4 x gpushare/vmem",
          order=", ".join(f"{n}(priority {p})" for n, p in DATA_TASKS), memory=f"{_share(files):.1%}")
    return running


def _share(files: NodeFiles) -> float:
    return files.memory_used / MEMORY_TOTAL


async def raise_pressure(s: Scenario, files: NodeFiles, running: dict[str, Obj],
                         samples: list[events.SpareCapacity]) -> list[str]:  # fmt: skip
    """The data tasks grow to 1 GiB each: 80% of the node; the evicted pods, in eviction order."""
    for pod in running.values():
        files.set_pod(pod, GROWN)
    files.write()
    started = time.monotonic()
    s.say(f"node memory use raised to {_share(files):.0%} through the simulated cgroup tree "
          f"(the data tasks grow to 1 GiB each; threshold {THRESHOLD:.0%})")  # fmt: skip
    used = files.memory_used
    await wait_until(lambda: sample_with(samples, used), 30, "the detector's sample at 80%", s.cluster)
    s.hop("memory at 80% -> detector's sample published", time.monotonic() - started)
    await wait_until(lambda: len(pressure_records(s)) >= len(EXPECTED_EVICTED), 30, "pressure evictions",
                     s.cluster)  # fmt: skip
    for name in EXPECTED_EVICTED:
        await s.wait_gone(name, timeout=30)
    s.hop("memory at 80% -> 2 data tasks evicted and gone", time.monotonic() - started)
    return [r.pod.split("/")[-1] for r in pressure_records(s)]


async def relieve(s: Scenario, files: NodeFiles, running: dict[str, Obj],
                  samples: list[events.SpareCapacity]) -> dict[str, Any]:  # fmt: skip
    """The evicted pods' cgroups go away; the detector publishes the lower use."""
    for name in EXPECTED_EVICTED:
        files.remove_pod(running[name])
    files.write()
    used = files.memory_used
    await wait_until(lambda: sample_with(samples, used), 30, "the detector's sample after the evictions",
                     s.cluster)  # fmt: skip
    s.say(f"evicted tasks' cgroups removed: node memory at {_share(files):.1%}, under {THRESHOLD:.0%}")
    judged = await wait_until(lambda: solver_judged(s, round(_share(files), 4)), 30,
                              "the solver judging the sample after the evictions", s.cluster)  # fmt: skip
    s.say("the solver saw the node under the threshold and evicts nothing more",
          over=",".join(judged["over"]) or "-", evicted=",".join(judged["evicted"]))  # fmt: skip
    return judged


async def solver_judged(s: Scenario, ratio: float) -> dict[str, Any] | None:
    """The solver's pressure view once its last sample is at ``ratio`` of the node's memory."""
    status = await asyncio.to_thread(http_json, f"{s.cluster.service('solver').http}/status")
    pressure = status.get("pressure") or {}
    return pressure if pressure.get("memory_used_ratio") == ratio else None


async def check_kept(s: Scenario, evicted: list[str], judged: dict[str, Any]) -> None:
    if tuple(evicted) != EXPECTED_EVICTED:
        raise ScenarioError(f"expected {list(EXPECTED_EVICTED)} evicted in this order, got {evicted}")
    if judged["over"] or judged["evicted"] != [f"{s.namespace}/{name}" for name in EXPECTED_EVICTED]:
        raise ScenarioError(f"the solver should be under its thresholds after two evictions: {judged}")
    triggers = {r.trigger_id for r in pressure_records(s)}
    if len(triggers) != 1:
        raise ScenarioError(f"the two evictions should come from one decision, got triggers {sorted(triggers)}")
    kept = await s.pod("data-2")
    if kept is None or (kept.get("metadata") or {}).get("deletionTimestamp"):
        raise ScenarioError("data-2 (priority 100) should still run once memory is under the threshold")
    await s.wait_running("data-2", timeout=5)


async def release(s: Scenario, node: str) -> None:
    """Delete the scenario's pods and wait until the node let go of them (the cards are free for
    what follows: the API forgets a pod deleted with grace 0 before the node has stopped it)."""
    for pod in await s.pods():
        await s.delete(pod["metadata"]["name"])

    async def clear() -> bool:
        status = await asyncio.to_thread(http_json, f"{s.cluster.child(f'node@{node}').http}/status")
        return not any(str(p.get("pod", "")).startswith(f"{s.namespace}/") for p in status.get("pods") or [])

    await wait_until(clear, 60, f"{node} releasing the scenario's pods", s.cluster)


@scenario("oversell")
async def oversell(s: Scenario) -> str:
    node = s.cluster.nodes[0].name
    files = NodeFiles(s.cluster.run_dir / node / "oversell")
    files.write()
    s.say("the detector now reads the node's cgroup v2 tree and /proc from files this scenario writes",
          cgroup_root=files.cgroup, proc_root=files.proc)  # fmt: skip
    try:
        async with reconfigured(s, oversell_settings(files), KEEP), capacity_samples(s, node) as samples:
            await fill_cards(s, files, node)
            running = await start_data_tasks(s, files)
            evicted = await raise_pressure(s, files, running, samples)
            s.say("evicted under pressure, in order", pods=",".join(evicted))
            judged = await relieve(s, files, running, samples)
            await check_kept(s, evicted, judged)
    finally:
        await release(s, node)
        shutil.rmtree(files.root, ignore_errors=True)
    return (f"all {s.cluster.settings.gpus} cards allocated; memory at 80%: {' then '.join(evicted)} evicted "
            f"(lowest priority, then newest), data-2 kept at {_share(files):.1%}")  # fmt: skip
