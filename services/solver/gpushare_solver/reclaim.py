"""Reclaim: kill the pods' container tasks, release the owner, delete the pods, record each eviction.

Steps (each persisted in the plan's :class:`ReclaimProgress`, so a restarted
solver resumes at the step it stopped):

1. find every container of every pod (``status.*containerStatuses[].containerID``);
2. SIGKILL all of them in parallel through containerd and wait for the exits;
3. release the owner (kmod ``release``) as soon as the tasks exited, or at the
   deadline (logged) if they take longer. Meanwhile, while the kill is in
   progress, ask the kernel to keep holding the owner (kmod ``hold``): first
   ``HOLD_FIRST_S`` after the kill began, then every third of the module's
   ``timeout_ms`` (each hold reply says it), until the tasks are dead, the
   release deadline, or a hold moves nothing any more (the reclaim ended, or
   the module's ``max_hold_ms`` from the hit is reached). A borrower whose
   exit waits for the GPU driver to free its memory can take longer than the
   module's timeout (3 s): without holds the owner would run beside it;
4. delete the pods with grace period 0 (uid precondition);
5. publish one :class:`EvictionRecord` per pod with an id derived from the
   trigger and the pod, so a replay is dropped by JetStream's de-duplication.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gpushare_common.adapters.kube import NotFound
from gpushare_common.bus import BusError, Transient
from gpushare_common.events import EvictionRecord, KmodCommand
from gpushare_common.ids import parse_pod_key
from gpushare_common.logging import get_logger
from gpushare_common.retry import Backoff, Stopped, retry

from .actions import Reclaim, ReclaimProgress
from .adapters.containerd import ContainerdError
from .metrics import SolverMetrics
from .ports import Obj, Outbox, PodApi, TaskApi
from .settings import SolverSettings

log = get_logger("solver.reclaim")
Save = Callable[[], Awaitable[None]]
HOLD_FIRST_S = 1.0  # a third of the module's default timeout_ms (3 s); hold replies give the real one


def record_id(trigger_id: str, pod: str) -> str:
    return hashlib.sha256(f"{trigger_id}\n{pod}".encode()).hexdigest()[:32]


def container_ids(pod: Obj) -> list[str]:
    """The runtime ids of every container of the pod (``containerd://<id>``); odd shapes are skipped."""
    status = pod.get("status")
    found: list[str] = []
    if not isinstance(status, dict):
        return found
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        items = status.get(key)
        for item in items if isinstance(items, list) else []:
            runtime_id = item.get("containerID") if isinstance(item, dict) else None
            if isinstance(runtime_id, str) and "://" in runtime_id and runtime_id.split("://", 1)[1]:
                found.append(runtime_id.split("://", 1)[1])
    return found


class Reclaimer:
    def __init__(self, node: str, settings: SolverSettings, pods: PodApi, tasks: TaskApi,
                 outbox: Outbox, eviction_subject: str, metrics: SolverMetrics) -> None:
        self.node = node
        self.settings = settings
        self.pods = pods
        self.tasks = tasks
        self.outbox = outbox
        self.subject = eviction_subject
        self.metrics = metrics
        self.known: dict[str, list[str]] = {}  # borrower pod -> container ids seen earlier
        self.pids: dict[str, int] = {}  # container id -> init pid seen earlier (checked before use)
        self.after_kill: Callable[[], Awaitable[None]] | None = None  # a test's hook
        self.hold_first_s = HOLD_FIRST_S

    async def run(self, action: Reclaim, progress: ReclaimProgress, trigger_id: str,
                  received: float, save: Save) -> None:
        if not progress.killed:
            await self._kill(action, progress, received, save)
            if self.after_kill is not None:
                await self.after_kill()
        if action.release is not None and not progress.released:
            await self._release(action, progress, received)
            await save()
        outcomes = await asyncio.gather(*(self._delete(pod, progress) for pod in action.pods))
        for pod, (outcome, delete_ms, error) in zip(action.pods, outcomes, strict=True):
            await self._record(action, progress, trigger_id, received, pod, (outcome, delete_ms, error))

    async def learn(self, pod: str) -> None:
        """Remember a borrower's containers ahead of time, so a reclaim can kill at once."""
        uid, ids = await self._containers(pod)
        if ids:
            self.known[pod] = ids
            with contextlib.suppress(ContainerdError):
                self.pids.update(await self.tasks.pids(ids))
        elif not uid:
            self.known.pop(pod, None)

    def forget(self, pod: str) -> None:
        for container_id in self.known.pop(pod, []):
            self.pids.pop(container_id, None)

    async def _kill(self, action: Reclaim, progress: ReclaimProgress, received: float, save: Save) -> None:
        """Kill the containers known ahead at once while the pods are read; kill any container
        found late. The owner is released when every task known is dead (or at the deadline)."""
        progress.started = progress.started or time.time()
        start = time.perf_counter()
        all_known = all(pod in self.known for pod in action.pods)
        ahead = [c for pod in action.pods for c in self.known.get(pod, [])]
        pids = {c: self.pids.pop(c) for c in ahead if c in self.pids}
        kills = [asyncio.ensure_future(self.tasks.kill_all(ahead, self.settings.kill_timeout_s, pids))]
        if all_known:  # the pods are read after the release: reading threads would slow both down
            await self._release_when_dead(kills[0], action, progress, received)
        reading = asyncio.gather(*(self._containers(pod) for pod in action.pods))
        for pod, (uid, ids) in zip(action.pods, await reading, strict=True):
            progress.uids[pod] = uid
            progress.containers[pod] = list(dict.fromkeys(self.known.pop(pod, []) + ids))
        late = [c for ids in progress.containers.values() for c in ids if c not in ahead]
        if late and all_known:
            log.warning("containers unknown ahead killed after the release", node=self.node,
                        owner=action.owner, containers=",".join(late))
        kills.append(asyncio.ensure_future(self.tasks.kill_all(late, self.settings.kill_timeout_s)))
        killing = asyncio.ensure_future(asyncio.gather(*kills))
        await self._release_when_dead(killing, action, progress, received)
        await self._finish_kill(killing, action, progress, start)
        await save()

    async def _release_when_dead(self, killing: asyncio.Future[Any], action: Reclaim,
                                 progress: ReclaimProgress, received: float) -> None:
        if action.release is None or progress.released:
            return
        holding = asyncio.ensure_future(self._hold_while(killing, action))
        try:
            done, _ = await asyncio.wait({killing}, timeout=self.settings.release_deadline_s)
        finally:
            holding.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await holding
        if not done:
            log.warning("borrowers still running at the release deadline; releasing the owner now",
                        node=self.node, owner=action.owner, pods=",".join(action.pods),
                        deadline_s=self.settings.release_deadline_s)
        await self._release(action, progress, received)

    async def _hold_while(self, killing: asyncio.Future[Any], action: Reclaim) -> None:
        """Keep the owner blocked in the kernel while the borrowers are still being killed."""
        assert action.release is not None
        command = KmodCommand(node=self.node, op="hold", pods=action.release.pods,
                              pidns=action.release.pidns, reason=action.reason)
        every, held = self.hold_first_s, 0
        while not (await asyncio.wait({killing}, timeout=every))[0]:
            try:
                reply = await self.outbox.kmod(command)
            except BusError as err:  # no kmod-bridge now, or one that does not know hold
                log.warning("hold not delivered", node=self.node, owner=action.owner, error=str(err))
                continue
            if reply.status <= 0:
                log.warning("the kernel holds the owner no longer; borrowers still being killed",
                            node=self.node, owner=action.owner, status=reply.status, message=reply.message)
                return
            every = reply.timeout_ms / 3000 if reply.timeout_ms > 0 else every
            held += 1
            if held == 1:
                log.info("borrowers slow to die: holding the owner", node=self.node, owner=action.owner,
                         every_s=round(every, 3))

    async def _finish_kill(self, killing: asyncio.Future[Any], action: Reclaim,
                           progress: ReclaimProgress, start: float) -> None:
        try:
            await killing
        except ContainerdError as err:
            log.error("killing borrower tasks failed; deleting the pods anyway", node=self.node,
                      owner=action.owner, error=str(err))
        progress.kill_ms = (time.perf_counter() - start) * 1000
        progress.killed = True
        self.metrics.kill_seconds.labels(action.reason).observe(progress.kill_ms / 1000)

    async def _containers(self, pod: str) -> tuple[str, list[str]]:
        namespace, name = parse_pod_key(pod)
        try:
            obj = await self.pods.get_pod(namespace, name)
        except NotFound:
            return "", []
        return str((obj.get("metadata") or {}).get("uid") or ""), container_ids(obj)

    async def _release(self, action: Reclaim, progress: ReclaimProgress, received: float) -> None:
        """Wake the owner. A release that cannot be delivered is tried again for
        ``release_retry_s`` (the kmod-bridge may be reconnecting); after that the kernel's own
        timeout frees the owner, and the borrowers are dead by then."""
        assert action.release is not None
        command = KmodCommand(node=self.node, op="release", pods=action.release.pods,
                              pidns=action.release.pidns, reason=action.reason)
        progress.released = True
        try:
            reply = await retry(lambda: self.outbox.kmod(command), (Transient,), "release the owner",
                                backoff=Backoff(0.02, 0.5), deadline_s=self.settings.release_retry_s,
                                node=self.node, owner=action.owner)  # fmt: skip
        except (Stopped, BusError) as err:
            log.error("release not delivered; the owner waits for the kernel's timeout", node=self.node,
                      owner=action.owner, error=str(err))
            return
        self.metrics.release_seconds.observe(max(0.0, time.time() - received))
        if reply.status < 0:  # a negative errno; >= 0 is success (release: owners woken)
            log.warning("kernel refused release", node=self.node, owner=action.owner,
                        status=reply.status, message=reply.message)

    async def _delete(self, pod: str, progress: ReclaimProgress) -> tuple[str, float, str]:
        if pod in progress.uids and not progress.uids[pod]:
            return ("evicted" if progress.containers.get(pod) else "already-gone"), 0.0, ""
        namespace, name = parse_pod_key(pod)
        start = time.perf_counter()
        outcome = "evicted"
        try:  # other Kubernetes errors propagate: the plan is retried from this step
            await self.pods.delete_pod(namespace, name, grace_seconds=0, uid=progress.uids.get(pod, ""))
        except NotFound:
            outcome = "evicted" if progress.containers.get(pod) else "already-gone"
        return outcome, (time.perf_counter() - start) * 1000, ""

    async def _record(self, action: Reclaim, progress: ReclaimProgress, trigger_id: str,
                      received: float, pod: str, result: tuple[str, float, str]) -> None:
        outcome, delete_ms, error = result
        record = EvictionRecord(
            node=self.node, id=record_id(trigger_id, pod), pod=pod, reason=action.reason,
            owner=action.owner, containers=tuple(progress.containers.get(pod, ())),
            kill_ms=round(progress.kill_ms, 3), delete_ms=round(delete_ms, 3),
            total_ms=round((time.time() - received) * 1000, 3), trigger_id=trigger_id,
            outcome=outcome, error=error)
        await self.outbox.publish_once(self.subject, record)
        self.metrics.evictions.labels(action.reason, outcome).inc()
        log.info("evicted", node=self.node, pod=pod, reason=action.reason, owner=action.owner,
                 outcome=outcome, kill_ms=record.kill_ms, total_ms=record.total_ms)
