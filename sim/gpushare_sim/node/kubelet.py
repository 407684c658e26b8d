"""The kubelet stand-in's pod lifecycle: admit (allocate devices), start the
containers, report status, and on deletion kill the containers, release the
devices and confirm the deletion with grace 0.

The desired pod set arrives through :meth:`Kubelet.sync` (the pods bound to
this node, as the API lists them); everything else happens in one guarded task
per pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpushare_sim.node.adapters.deviceplugins import (
    ContainerAllocation,
    DevicePluginManager,
    PluginError,
)
from gpushare_sim.node.adapters.kube import KubeError
from gpushare_sim.node.adapters.runners import Runner, RunnerError
from gpushare_sim.node.claims import ClaimAdmissionError, ClaimPreparer
from gpushare_sim.node.devices import ContainerKey, DeviceConflict, DeviceTable
from gpushare_sim.node.events import NORMAL, WARNING, EventRecorder, Involved
from gpushare_sim.node.health import DeviceKey, with_resource_status
from gpushare_sim.node.model import ContainerDef, PodDef
from gpushare_sim.node.spec import SpecContext, container_spec
from gpushare_sim.node.status import ContainerState, admission_failure, pod_status

log = logging.getLogger("gpushare_sim.node.kubelet")

NATIVE_RESOURCES = {"cpu", "memory", "pods", "ephemeral-storage"}


class PodApi(Protocol):
    async def write_pod_status(self, namespace: str, name: str, status: dict[str, Any]) -> None: ...
    async def confirm_pod_deletion(self, namespace: str, name: str) -> None: ...


class AdmissionError(Exception):
    """A pod cannot run on this node (devices missing, plugin failed)."""


@dataclass
class PodWorker:
    pod: PodDef
    containers: list[ContainerState]
    ids: dict[str, str] = field(default_factory=dict)  # container name -> container id
    allocations: dict[str, ContainerAllocation] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    terminating: bool = False
    unreported: bool = False  # the last status write failed: written again at the next sync


def restarts(policy: str, exit_code: int | None) -> bool:
    return policy == "Always" or (policy == "OnFailure" and exit_code != 0)


def restart_backoff(restarts_so_far: int) -> float:
    """Seconds before a restart: 1, 2, 4, ... up to 30 (the kubelet's back-off, shortened)."""
    return float(min(30, 2 ** min(restarts_so_far, 5)))


def device_requests(container: ContainerDef) -> dict[str, int]:
    """Requests of device-plugin resources (every extended resource) of one container."""
    return {
        r: int(q)
        for r, q in container.resources.items()
        if "/" in r and not r.startswith(("hugepages-", "kubernetes.io/")) and q > 0
    }


class Kubelet:
    def __init__(
        self,
        table: DeviceTable,
        plugins: DevicePluginManager,
        runner: Runner,
        api: PodApi,
        context: SpecContext,
        events: EventRecorder | None = None,
        claims: ClaimPreparer | None = None,
    ) -> None:
        self.events = events or EventRecorder(None, "kubelet")
        self.table = table
        self.plugins = plugins
        self.runner = runner
        self.api = api
        self.context = context
        self.claims = claims  # DRA: the pods' resource claims (None: a node without DRA)
        self.workers: dict[str, PodWorker] = {}
        self._admit_lock = asyncio.Lock()
        self._killers: set[asyncio.Task[None]] = set()
        self._confirmed: set[str] = set()

    # --- desired state -------------------------------------------------------

    async def sync(self, pods: list[PodDef]) -> None:
        present = {p.uid or p.key: p for p in pods}
        for uid, pod in present.items():
            worker = self.workers.get(uid)
            if worker is None and not pod.deleting and pod.phase in ("Pending", "Running"):
                self._start_worker(uid, pod)
            elif worker is not None and pod.deleting and not worker.terminating:
                await self._terminate(uid, confirm=True)
            elif worker is None and pod.deleting and uid not in self._confirmed:
                # never ran here (or ran before a restart of this node): nothing to kill
                if await self._safely(self.api.confirm_pod_deletion(pod.namespace, pod.name), pod.key):
                    self._confirmed.add(uid)
            elif worker is not None and worker.unreported and not worker.terminating:
                await self._report(worker)  # as the kubelet's status manager, until the API takes it
        self._confirmed &= set(present)
        for uid in [u for u in self.workers if u not in present]:
            if not self.workers[uid].terminating:
                await self._terminate(uid, confirm=False)

    def _start_worker(self, uid: str, pod: PodDef) -> None:
        states = [ContainerState(c.name, c.image) for c in pod.containers]
        worker = PodWorker(pod, states)
        worker.task = asyncio.create_task(self._run_pod(uid, worker), name=f"pod-{pod.key}")
        worker.task.add_done_callback(_log_crash)
        self.workers[uid] = worker

    # --- one pod -------------------------------------------------------------

    async def _run_pod(self, uid: str, worker: PodWorker) -> None:
        pod = worker.pod
        try:
            allocations = await self._admit(uid, pod)
        except AdmissionError as err:
            log.warning("pod admission failed pod=%s: %s", pod.key, err)
            self.events.record(Involved.pod(pod), WARNING, "UnexpectedAdmissionError", str(err))
            self.table.release_pod(uid)
            if self.claims is not None:
                await self.claims.release_pod(uid)
            failure = admission_failure("UnexpectedAdmissionError", str(err))
            await self._safely(self.api.write_pod_status(pod.namespace, pod.name, failure), pod.key)
            return
        await self._start_containers(worker, allocations)
        await self._report(worker)
        await self._wait_exits(worker)

    def _reclaim_inactive(self, admitting: str) -> None:
        """Like the kubelet's device manager at admission: devices held by pods that are no
        longer active (terminating, or gone from the API while their containers die) are free."""
        held = {key.pod_uid for key, _ in self.table.holders()}
        for uid in held - {admitting}:
            worker = self.workers.get(uid)
            if worker is None or worker.terminating:
                self.table.release_pod(uid)

    async def _admit(self, uid: str, pod: PodDef) -> dict[str, ContainerAllocation]:
        allocations: dict[str, ContainerAllocation] = {}
        async with self._admit_lock:
            self._reclaim_inactive(uid)
            for container in pod.containers:
                key = ContainerKey(uid, pod.namespace, pod.name, container.name)
                allocation = ContainerAllocation()
                for resource, count in sorted(device_requests(container).items()):
                    allocation.merge(await self._allocate(key, resource, count))
                allocations[container.name] = allocation
            for name, annotations in (await self._prepare_claims(uid, pod)).items():
                allocations[name].annotations.update(annotations)
        return allocations

    async def _prepare_claims(self, uid: str, pod: PodDef) -> dict[str, dict[str, str]]:
        """NodePrepareResources for the pod's claims: per container, the annotations that give it
        its claims' CDI devices."""
        if not pod.claims:
            return {}
        if self.claims is None:
            raise AdmissionError(f"pod {pod.key} has resource claims and this node runs no DRA plugins")
        try:
            return await self.claims.prepare_pod(uid, pod)
        except ClaimAdmissionError as err:
            raise AdmissionError(str(err)) from err

    async def _allocate(self, key: ContainerKey, resource: str, count: int) -> Any:
        free = self.table.free(resource)
        if len(free) < count:
            raise AdmissionError(
                f"{resource}: {count} requested, {len(free)} healthy and free (container {key.container})"
            )
        chosen = await self.plugins.preferred(resource, free, count)
        try:
            self.table.record(key, resource, chosen)
            return await self.plugins.allocate(resource, chosen)
        except (DeviceConflict, PluginError) as err:
            raise AdmissionError(str(err)) from err

    async def _start_containers(self, worker: PodWorker, allocations: dict[str, ContainerAllocation]) -> None:
        worker.allocations = allocations
        for container, state in zip(worker.pod.containers, worker.containers, strict=True):
            await self._start_one(worker, container, state)

    async def _start_one(self, worker: PodWorker, container: ContainerDef, state: ContainerState) -> None:
        """Start one instance of the container (the next attempt after a restart: the same
        config, the same allocation); the instance before it is removed once this one runs."""
        pod = worker.pod
        spec = container_spec(self.context, pod, container, worker.allocations[container.name],
                              secrets.token_hex(32), state.restart_count)  # fmt: skip
        previous = worker.ids.get(container.name)
        if previous is not None:
            state.previous_id, state.previous_log = previous, state.log
        state.exit_code = state.finished_at = None
        state.message = ""
        involved = Involved.pod(pod, container.name)
        pulled = f'Container image "{container.image}" already present on machine'
        self.events.record(involved, NORMAL, "Pulled", pulled)
        try:
            started = await self.runner.start(spec)
            worker.ids[container.name] = state.container_id = started.container_id
            state.log, state.started_at = started.log, time.time()
            log.info("container started pod=%s container=%s id=%s", pod.key,
                     container.name, started.container_id[:12])  # fmt: skip
            self.events.record(involved, NORMAL, "Created", f"Created container: {container.name}")
            self.events.record(involved, NORMAL, "Started", f"Started container: {container.name}")
        except RunnerError as err:
            log.warning("container start failed pod=%s: %s", pod.key, err)
            self.events.record(involved, WARNING, "Failed", f"Error: {err.reason}")
            worker.ids[container.name] = state.container_id = err.container_id
            state.log, state.started_at = None, time.time()
            state.finished_at, state.exit_code = state.started_at, 128
            state.message = str(err)
        if previous is not None:
            await self.runner.remove(previous)

    async def _follow(self, worker: PodWorker, container: ContainerDef, state: ContainerState) -> None:
        """Wait for the container to exit; restart it as the pod's restartPolicy says."""
        while True:
            if state.exit_code is None:
                state.exit_code = await self.runner.wait(state.container_id)
                state.finished_at = time.time()
                log.info("container exited pod=%s container=%s code=%s", worker.pod.key,
                         state.name, state.exit_code)  # fmt: skip
            if worker.terminating:
                return
            await self._report(worker)
            if not restarts(worker.pod.restart_policy, state.exit_code):
                return
            if state.exit_code != 0:
                pod = worker.pod
                self.events.record(Involved.pod(pod, state.name), WARNING, "BackOff",
                                   f"Back-off restarting failed container {state.name} in pod "
                                   f"{pod.name}_{pod.namespace}({pod.uid})")  # fmt: skip
            await asyncio.sleep(restart_backoff(state.restart_count))
            state.restart_count += 1
            await self._start_one(worker, container, state)
            await self._report(worker)

    async def _wait_exits(self, worker: PodWorker) -> None:
        pairs = zip(worker.pod.containers, worker.containers, strict=True)
        await asyncio.gather(*(self._follow(worker, c, s) for c, s in pairs))
        if not worker.terminating:
            self.table.release_pod(worker.pod.uid or worker.pod.key)

    async def _report(self, worker: PodWorker) -> None:
        status = pod_status(worker.pod, worker.containers, self.context.host_ip)
        pod = worker.pod
        if self.claims is not None and pod.claims:  # ResourceHealthStatus: the claims' device health
            uid = pod.uid or pod.key
            status = with_resource_status(status, self.claims.resource_status(uid, [c.name for c in pod.containers]))
        worker.unreported = not await self._safely(self.api.write_pod_status(pod.namespace, pod.name, status),
                                                   pod.key)

    async def health_changed(self, devices: set[DeviceKey]) -> None:
        """A driver reported new health for ``devices``: the pods using them report again."""
        if self.claims is None:
            return
        for uid in sorted(self.claims.pods_using(devices)):
            worker = self.workers.get(uid)
            if worker is not None and not worker.terminating:
                await self._report(worker)

    @staticmethod
    async def _safely(call: Awaitable[None], pod: str) -> bool:
        """An API write whose failure is logged (and written again at the next sync); True when done."""
        try:
            await call
        except KubeError as err:
            log.warning("API write failed pod=%s: %s", pod, err)
            return False
        return True

    # --- termination ---------------------------------------------------------

    async def _terminate(self, uid: str, confirm: bool) -> None:
        worker = self.workers[uid]
        worker.terminating = True
        log.info("pod terminating pod=%s", worker.pod.key)
        task = asyncio.create_task(self._kill_pod(uid, worker, confirm), name=f"kill-{uid}")
        task.add_done_callback(_log_crash)
        task.add_done_callback(self._killers.discard)
        self._killers.add(task)

    async def _kill_pod(self, uid: str, worker: PodWorker, confirm: bool) -> None:
        for state in worker.containers:
            if state.running:
                self.events.record(Involved.pod(worker.pod, state.name), NORMAL, "Killing",
                                   f"Stopping container {state.name}")  # fmt: skip
        await asyncio.gather(*(self.runner.kill(i) for i in worker.ids.values()))
        if worker.task is not None:
            worker.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker.task
        await asyncio.gather(*(self.runner.remove(i) for i in worker.ids.values()))
        await self.runner.remove_pod(uid)
        self.table.release_pod(uid)
        if self.claims is not None:
            await self.claims.release_pod(uid)
        self.workers.pop(uid, None)
        if confirm:
            await self._safely(self.api.confirm_pod_deletion(worker.pod.namespace, worker.pod.name), uid)
        log.info("pod removed pod=%s", worker.pod.key)

    async def close(self) -> None:
        """Kill every container (pods stay in the API, as when a kubelet stops)."""
        if self._killers:
            await asyncio.wait(list(self._killers), timeout=30)
        for uid in list(self.workers):
            worker = self.workers.get(uid)
            if worker is not None:
                await self._kill_pod(uid, worker, confirm=False)

    # --- views ---------------------------------------------------------------

    def container(self, namespace: str, pod: str, container: str) -> ContainerState | None:
        """The state of one container of a pod this node runs (None: no such pod or container)."""
        for worker in self.workers.values():
            if worker.pod.namespace == namespace and worker.pod.name == pod:
                return next((c for c in worker.containers if c.name == container), None)
        return None

    def pods(self) -> list[tuple[str, str, str, list[str]]]:
        return [
            (w.pod.namespace, w.pod.name, uid, [c.name for c in w.pod.containers])
            for uid, w in sorted(self.workers.items(), key=lambda kv: kv[1].pod.key)
        ]

    def snapshot(self) -> list[dict[str, Any]]:
        return [
            {"pod": w.pod.key, "terminating": w.terminating,
             "containers": [c.status() for c in w.containers]}
            for w in self.workers.values()
        ]  # fmt: skip


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("task crashed name=%s", task.get_name(), exc_info=task.exception())
