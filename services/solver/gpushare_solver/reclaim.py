"""Reclaim: kill the pods' container tasks, release the owner, delete the pods, record each eviction.

Steps (each persisted in the plan's :class:`ReclaimProgress`, so a restarted
solver resumes at the step it stopped):

0. verify each pod before anything is done to it: it must be recorded as taken out of the
   mapping cache by a handler of this solver (:class:`~.state.Victim`), or named by the
   kubelet's pod-resources as holding one of the spot devices taken back (``lent``: a borrower
   whose SpotEvent has not reached the solver yet), run on this node and carry the recorded
   uid; and the kubelet, asked now (pod-resources), must confirm that it holds one of the
   devices it was recorded with (any gpushare device when none was recorded) — no kill rests
   on the word of the service whose event put it on record (:func:`unconfirmed`). A pod that
   fails is *refused* (logged, counted by reason, neither killed nor deleted), whatever the
   plan says — a plan is data in a bucket, the checks are not; a kubelet that cannot answer
   stops the reclaim before any kill, and the plan is tried again. A pod the kubelet confirmed to
   this process is not asked about again when its reclaim is retried (an API server down for the
   read after the kill): the kill already freed its devices (``Reclaimer.confirmed``, memory only,
   so a plan in the bucket never vouches for a pod). The lookup of borrowers not
   reported yet comes only after a *fence*: the device plugin has applied the Unhealthy health
   of the devices taken back and answered, so it refuses every Allocate of them from then on
   and no pod admitted after the lookup can hold one;
1. find every container of every pod (``status.*containerStatuses[].containerID``);
2. SIGKILL all of them in parallel through containerd and wait for the exits;
3. release the owner (kmod ``release``) as soon as the tasks exited: the whole pid
   namespace of each container is gone then (see docs/failures.md, "Which dead the release
   waits for"). Meanwhile the kmod-bridge keeps the owner held in the kernel (it holds from
   the kernel's notice until this release); the kernel's ``max_hold_ms`` bounds that, and the
   wait for the killed tasks is that long too (the module's parameter, read from the kernel
   through the kmod-bridge: :class:`~gpushare_common.hold.HoldTiming`). A kill that fails
   releases nothing: the plan is retried, and the kernel lets the owner go at its deadline;
4. tell each pod why, in Kubernetes' terms (:mod:`.disruption`): its ``DisruptionTarget``
   condition, then an Event (a refused pod gets a Warning Event); after the release, so the
   owner never waits for it;
5. delete the pods with grace period 0 (uid precondition);
6. publish one :class:`EvictionRecord` per pod with an id derived from the
   trigger and the pod, so a replay is dropped by JetStream's de-duplication.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gpushare_common.adapters.kube import KubeError, NotFound
from gpushare_common.adapters.podresources import PodResourcesError
from gpushare_common.bus import BusError, Transient
from gpushare_common.events import DeviceHealth, EvictionRecord, KmodCommand, KmodReply
from gpushare_common.hold import HoldTiming
from gpushare_common.ids import parse_pod_key
from gpushare_common.logging import get_logger
from gpushare_common.mapping import IDLE_SPACE
from gpushare_common.pods import PodError, PodRules, read_pod
from gpushare_common.retry import Backoff, Stopped, retry

from . import disruption
from .actions import Reclaim, ReclaimProgress
from .confirm import NOT_ON_KUBELET, Kubelet
from .metrics import SolverMetrics
from .ports import Allocations, ContainerdError, Outbox, PodApi, TaskApi
from .settings import SolverSettings
from .spot import OWNER_BACK
from .state import Evicted, Victim

log = get_logger("solver.reclaim")
Save = Callable[[], Awaitable[None]]


def record_id(trigger_id: str, pod: str) -> str:
    return hashlib.sha256(f"{trigger_id}\n{pod}".encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Seen:
    """A pod as the API last showed it: who it is, where it runs, its containers; or why it
    could not be read (``malformed``)."""

    uid: str
    node: str
    containers: tuple[str, ...] = ()
    malformed: str = ""


def refusal(victim: Victim | None, seen: Seen | None, node: str) -> str:
    """Why a pod must not be killed or deleted ("" when it may): it was not taken out of the
    cache by this solver, it does not decode (who it is and where it runs are unknown), it runs
    on another node, or it is another pod of the same name."""
    if victim is None:
        return "not-taken-out-of-the-cache"
    if seen is not None and seen.malformed:
        return "malformed-pod"
    if seen is None or not seen.uid:
        return ""  # gone already: nothing to kill, nothing to delete
    if seen.node != node:
        return "on-another-node"
    if victim.uid and seen.uid != victim.uid:
        return "uid-mismatch"
    return ""


class Reclaimer:
    def __init__(self, node: str, settings: SolverSettings, pods: PodApi, tasks: TaskApi,
                 outbox: Outbox, eviction_subject: str, metrics: SolverMetrics,
                 victims: Callable[[], dict[str, Victim]] = dict, allocations: Allocations | None = None,
                 rules: PodRules | None = None, evicted: Evicted | None = None) -> None:  # fmt: skip
        self.node = node
        self.victims = victims
        self.allocations = allocations  # the kubelet's pod-resources: who holds which spot device
        self.rules = rules or PodRules()
        self.evicted = evicted if evicted is not None else Evicted()
        self.settings = settings
        self.pods = pods
        self.tasks = tasks
        self.outbox = outbox
        self.subject = eviction_subject
        self.metrics = metrics
        self.kubelet = Kubelet(node, allocations, self.rules, metrics)  # confirms every pod before a kill
        self.known: dict[str, Seen] = {}  # borrower pod -> as the API showed it earlier
        self.pids: dict[str, int] = {}  # container id -> init pid seen earlier (checked before use)
        self.timing = HoldTiming()  # the kernel's hold parameters, as the kmod-bridge last reported them
        self._failures_told: set[tuple[str, str]] = set()  # (pod, step) whose failure has its Warning Event
        # pods the kubelet confirmed to this process for a reclaim not finished yet: a retry of it
        # does not ask again, as the kill it began frees the pod's devices (memory only, never the
        # plan in the bucket: a plan cannot vouch for a pod)
        self.confirmed: set[str] = set()

    async def run(self, action: Reclaim, progress: ReclaimProgress, trigger_id: str,
                  received: float, save: Save) -> None:
        if not progress.killed:
            await self._kill(action, progress, received, save)
        if action.release is not None and not progress.released:
            await self._release(action, progress, received)
            await save()
        pods = [p for p in _pods(action, progress) if p not in progress.refused]
        await asyncio.gather(self._warn_refused(action, progress),
                             *(self._explain(action, progress, pod) for pod in pods))
        outcomes = await asyncio.gather(*(self._delete(pod, action, progress) for pod in pods))
        for pod, (outcome, delete_ms, error) in zip(pods, outcomes, strict=True):
            await self._record(action, progress, trigger_id, received, pod, (outcome, delete_ms, error))
            self.victims().pop(pod, None)
            self.confirmed.discard(pod)
            self.evicted.add(pod, progress.uids.get(pod, ""))
            self._failures_told.difference_update({(pod, "kill"), (pod, "delete")})
        if action.reason == OWNER_BACK:
            self.metrics.owner_back_done(received, progress.dead_at, progress.released_at,
                                         time.time() if pods else 0.0)

    async def learn(self, pod: str) -> None:
        """Remember a borrower's containers ahead of time, so a reclaim can kill at once."""
        seen = await self._read(pod)
        if seen is not None and seen.containers:
            self.known[pod] = seen
            with contextlib.suppress(ContainerdError):
                self.pids.update(await self.tasks.pids(list(seen.containers)))
        elif seen is None or seen.malformed:
            self.known.pop(pod, None)

    def forget(self, pod: str) -> None:
        seen = self.known.pop(pod, None)
        for container_id in seen.containers if seen else ():
            self.pids.pop(container_id, None)

    def _refuse(self, pod: str, why: str, action: Reclaim, progress: ReclaimProgress) -> None:
        progress.refused[pod] = why
        self.victims().pop(pod, None)
        self.confirmed.discard(pod)
        self.metrics.refused.labels(why).inc()
        log.error("eviction refused: not a borrower or sharer this solver took out", node=self.node,
                  pod=pod, reason=action.reason, owner=action.owner, why=why)

    async def _kill(self, action: Reclaim, progress: ReclaimProgress, received: float, save: Save) -> None:
        """Kill the containers known ahead at once while the pods are read; kill any container
        found late. The owner is released when every task known is dead (or at the deadline)."""
        progress.started = progress.started or time.time()
        start = time.perf_counter()
        unlisted = await self._verify(action, progress)
        discovering = self._discover(action, progress)
        victims = {**progress.found, **self.victims()}
        pods = [p for p in _pods(action, progress) if p not in progress.refused]
        all_known = all(pod in self.known for pod in pods)
        ahead = [c for pod in pods if pod not in unlisted for c in self._known_containers(pod)]
        pids = {c: self.pids.pop(c) for c in ahead if c in self.pids}
        kills = [self._timed_kill(ahead, progress, pids)]
        if discovering is not None:  # a few ms beside the kill: the release waits for it
            found = await discovering
            victims.update({pod: progress.found[pod] for pod in found})
            pods.extend(found)
            all_known = all_known and not found
        if all_known:  # the pods are read after the release: reading threads would slow both down
            await self._release_when_dead(kills[0], action, progress, received)
        reading = asyncio.gather(*(self._read(pod) for pod in pods))
        for pod, seen in zip(pods, await reading, strict=True):
            why = refusal(victims.get(pod), seen, self.node)
            if not why and pod in unlisted and seen is not None and seen.uid:
                why = NOT_ON_KUBELET
            if why:  # known ahead and killed: the pod of that name is another one now; never deleted
                self._refuse(pod, why, action, progress)
                continue
            progress.uids[pod] = seen.uid if seen else ""
            progress.containers[pod] = list(dict.fromkeys([*self._known_containers(pod, pop=True),
                                                           *(seen.containers if seen else ())]))
        late = [c for p, ids in progress.containers.items() if p not in progress.refused
                for c in ids if c not in ahead]
        if late and all_known:
            log.warning("containers unknown ahead killed after the release", node=self.node,
                        owner=action.owner, containers=",".join(late))
        kills.append(self._timed_kill(late, progress))
        killing = asyncio.ensure_future(asyncio.gather(*kills))
        await self._release_when_dead(killing, action, progress, received)
        await self._finish_kill(killing, action, progress, start)
        await save()

    async def _verify(self, action: Reclaim, progress: ReclaimProgress) -> set[str]:
        """Refuse what the ledger does not name, then what the kubelet does not confirm. Returns the
        pods the kubelet does not list: refused after the read unless the API says they are gone."""
        def ledger() -> dict[str, Victim]:
            return {**progress.found, **self.victims()}

        for pod in _pods(action, progress):
            if pod not in progress.refused and (why := refusal(ledger().get(pod), self.known.get(pod), self.node)):
                self._refuse(pod, why, action, progress)
        if all(p in progress.refused for p in _pods(action, progress)):
            return set()
        listing = await self.kubelet.listing(action)
        unlisted = set[str]()
        for pod in _pods(action, progress):
            if pod in progress.refused or pod in self.confirmed:
                continue
            why = self.kubelet.confirm(pod, ledger().get(pod), listing)
            if why == NOT_ON_KUBELET:
                unlisted.add(pod)
            elif why:
                self._refuse(pod, why, action, progress)
            else:
                self.confirmed.add(pod)
        return unlisted

    def _discover(self, action: Reclaim, progress: ReclaimProgress) -> asyncio.Future[list[str]] | None:
        """Look up, in the kubelet's pod-resources, the pods holding a spot device taken back that
        the plan does not name: borrowers whose SpotEvent has not reached the solver yet. They
        are added to ``progress.found`` (persisted with the plan) and killed before the release."""
        if not action.lent or self.allocations is None:
            return None
        allocations = self.allocations

        async def find() -> list[str]:
            await self._fence(action)
            try:
                users = self.rules.spot_users(await allocations.list())
            except PodResourcesError as err:
                self.metrics.discovered.labels("unreadable").inc()
                log.warning("pod-resources unreadable: borrowers unknown to the solver are not looked for",
                            node=self.node, owner=action.owner, error=str(err))
                return []
            lent, named = set(action.lent), {*action.pods, *progress.found}
            new = sorted(p for p, spot in users.items()
                         if lent.intersection(spot) and p not in named and not self.evicted.has(p))
            for pod in new:
                progress.found[pod] = Victim(devices=tuple(d for d in users[pod] if d in lent), owner=IDLE_SPACE,
                                             since=time.time())
            if new:
                self.metrics.discovered.labels("found").inc(len(new))
                log.warning("borrowers the solver did not know yet, named by the kubelet; killed before the release",
                            node=self.node, owner=action.owner, pods=",".join(new), reason=action.reason)
            return new

        return asyncio.ensure_future(find())

    async def _fence(self, action: Reclaim) -> None:
        """Before the lookup, the device plugin applies the Unhealthy health of the spot devices
        taken back and answers: from then on it refuses every Allocate of them, so no pod the
        kubelet admits after the lookup can hold one. Without an answer (no device plugin, as on
        a DRA node, or one restarting) the lookup goes on, as it did before fences."""
        health = DeviceHealth(node=self.node, resource=self.settings.spot_resource,
                              devices=dict.fromkeys(action.lent, "Unhealthy"),
                              reason=f"fence: {action.reason} {action.owner}".strip())
        try:
            applied = await self.outbox.fence(health)
        except BusError as err:
            self.metrics.fences.labels("unconfirmed").inc()
            log.warning("fence not confirmed: a pod admitted onto a card taken back meanwhile is evicted only "
                        "when its SpotEvent comes", node=self.node, owner=action.owner, error=str(err))
            return
        served = sorted(d for d, h in applied.devices.items() if h != "Unhealthy")
        self.metrics.fences.labels("open" if served else "confirmed").inc()
        if served:
            log.warning("the device plugin still serves spot devices taken back as Healthy", node=self.node,
                        owner=action.owner, devices=",".join(served))

    def _timed_kill(self, containers: list[str], progress: ReclaimProgress,
                    pids: dict[str, int] | None = None) -> asyncio.Future[Any]:
        """Kill ``containers`` and wait for their exits as long as the kernel may hold the owner
        (its ``max_hold_ms``); the moment they had all exited is the reclaim's ``dead_at``."""
        async def kill() -> Any:
            exits = await self.tasks.kill_all(containers, self.timing.max_hold_s, pids)
            if containers:
                progress.dead_at = max(progress.dead_at, time.time())
            return exits

        return asyncio.ensure_future(kill())

    async def _release_when_dead(self, killing: asyncio.Future[Any], action: Reclaim,
                                 progress: ReclaimProgress, received: float) -> None:
        """Release the owner once the kill finished; never after a kill that failed (the borrowers
        may live: the plan retries the kill first, and the kernel lets the owner go at its
        ``max_hold_ms``). Until the release the kmod-bridge holds the owner."""
        if action.release is None or progress.released:
            return
        await asyncio.wait({killing})
        if killing.exception() is not None:
            return
        await self._release(action, progress, received)

    async def kmod(self, command: KmodCommand) -> KmodReply:
        """A kmod-bridge request; its reply carries the kernel's hold parameters, kept here."""
        reply = await self.outbox.kmod(command)
        timing = self.timing.updated(reply.timeout_ms, reply.max_hold_ms)
        if timing != self.timing:
            log.info("kernel hold parameters", node=self.node, timeout_ms=timing.timeout_ms,
                     max_hold_ms=timing.max_hold_ms)
            self.timing = timing
        return reply

    async def read_timing(self, stop: asyncio.Event) -> None:
        """At start: ask the kernel (through the kmod-bridge, which may start later) for its hold
        parameters until it answers. Every later reply refreshes them."""
        command = KmodCommand(node=self.node, op="stats", reason="hold parameters")
        with contextlib.suppress(Stopped):
            await retry(lambda: self.kmod(command), (Transient,), "read the kernel's hold parameters", stop,
                        Backoff(0.5, 30.0), node=self.node)

    async def _finish_kill(self, killing: asyncio.Future[Any], action: Reclaim,
                           progress: ReclaimProgress, start: float) -> None:
        """A kill that failed is retried with the plan (the event is redelivered): the pods are
        never deleted, nor the owner released, while their tasks may still run."""
        try:
            exits = await killing
        except ContainerdError as err:
            log.error("killing borrower tasks failed; retrying", node=self.node, owner=action.owner,
                      error=str(err))
            pods = [p for p in _pods(action, progress) if p not in progress.refused]
            await asyncio.gather(*(self._warn_failed(pod, "kill", str(err), action) for pod in pods))
            raise
        progress.kill_ms = (time.perf_counter() - start) * 1000
        progress.killed = True
        if any(not e.gone for batch in exits for e in batch):  # timed only when a task was there to kill
            self.metrics.kill_seconds.labels(action.reason).observe(progress.kill_ms / 1000)

    def _known_containers(self, pod: str, pop: bool = False) -> tuple[str, ...]:
        seen = self.known.pop(pod, None) if pop else self.known.get(pod)
        return seen.containers if seen else ()

    async def _read(self, pod: str) -> Seen | None:
        """The pod as the API shows it now; None when it is gone."""
        namespace, name = parse_pod_key(pod)
        try:
            obj = await self.pods.get_pod(namespace, name)
        except NotFound:
            return None
        try:
            view = read_pod(obj, self.rules)
        except PodError as err:
            log.warning("pod does not decode", node=self.node, pod=pod, reason=err.reason)
            return Seen("", "", malformed=err.reason)
        return Seen(view.uid, view.node, tuple(view.container_ids.values()))

    async def _release(self, action: Reclaim, progress: ReclaimProgress, received: float) -> None:
        """Wake the owner. A release that cannot be delivered is tried again for
        ``release_retry_s`` (the kmod-bridge may be reconnecting); after that the kernel's own
        timeout frees the owner, and the borrowers are dead by then."""
        assert action.release is not None
        command = KmodCommand(node=self.node, op="release", pods=action.release.pods,
                              pidns=action.release.pidns, reason=action.reason)
        progress.released, progress.released_at = True, time.time()
        try:
            reply = await retry(lambda: self.kmod(command), (Transient,), "release the owner",
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

    async def _delete(self, pod: str, action: Reclaim, progress: ReclaimProgress) -> tuple[str, float, str]:
        if pod in progress.uids and not progress.uids[pod]:
            return ("evicted" if progress.containers.get(pod) else "already-gone"), 0.0, ""
        namespace, name = parse_pod_key(pod)
        start = time.perf_counter()
        outcome = "evicted"
        try:  # other Kubernetes errors propagate: the plan is retried from this step
            await self.pods.delete_pod(namespace, name, grace_seconds=0, uid=progress.uids.get(pod, ""))
        except NotFound:
            outcome = "evicted" if progress.containers.get(pod) else "already-gone"
        except KubeError as err:
            await self._warn_failed(pod, "delete", str(err), action)
            raise
        return outcome, (time.perf_counter() - start) * 1000, ""

    # --- telling the pods, in Kubernetes' terms (after the release: the owner never waits) ----------

    async def _explain(self, action: Reclaim, progress: ReclaimProgress, pod: str) -> None:
        """Set the pod's ``DisruptionTarget`` condition, then record the Event: before the delete,
        so the pod's last state says why it went. A pod already gone is told nothing."""
        uid = progress.uids.get(pod, "")
        if not uid:
            return
        victim = self.victims().get(pod) or progress.found.get(pod)
        owner = action.owner or (victim.owner if victim and victim.owner != IDLE_SPACE else "")
        cards = disruption.cards_of(victim.devices, victim.cards) if victim else ()
        told = disruption.explain(action.reason, owner, cards, self.node, action.over)
        namespace, name = parse_pod_key(pod)
        patch = {"status": {"conditions": [disruption.condition(told)]}}
        try:
            await self.pods.patch_pod_status(namespace, name, patch, strategic=True)
        except NotFound:
            return
        except KubeError as err:  # the eviction goes on: the Event still says why
            self.metrics.told.labels("condition", "failed").inc()
            log.warning("DisruptionTarget condition not set", node=self.node, pod=pod, reason=told.reason,
                        error=str(err))
        else:
            self.metrics.told.labels("condition", "written").inc()
        await self._tell(pod, uid, told.reason, told.message)

    async def _warn_refused(self, action: Reclaim, progress: ReclaimProgress) -> None:
        for pod, why in sorted(progress.refused.items()):
            if pod not in progress.warned:
                progress.warned.append(pod)
                message = disruption.refused_message(why, action.reason, action.owner, self.node)
                await self._tell(pod, "", disruption.EVICTION_REFUSED, message, warning=True)

    async def _warn_failed(self, pod: str, step: str, error: str, action: Reclaim) -> None:
        """One Warning Event per pod and failing step (not one per retry)."""
        if (pod, step) in self._failures_told:
            return
        self._failures_told.add((pod, step))
        message = disruption.failed_message(step, error, action.reason, action.owner, self.node)
        await self._tell(pod, "", disruption.EVICTION_FAILED, message, warning=True)

    async def _tell(self, pod: str, uid: str, reason: str, message: str, warning: bool = False) -> None:
        """An Event on the pod; one not recorded is logged and counted, never a step that fails."""
        namespace, _ = parse_pod_key(pod)
        try:
            await self.pods.create_event(namespace, disruption.event(pod, uid, reason, message, self.node, warning))
        except KubeError as err:
            self.metrics.told.labels("event", "failed").inc()
            log.warning("eviction Event not recorded", node=self.node, pod=pod, reason=reason, error=str(err))
            return
        self.metrics.told.labels("event", "written").inc()

    async def _record(self, action: Reclaim, progress: ReclaimProgress, trigger_id: str,
                      received: float, pod: str, result: tuple[str, float, str]) -> None:
        outcome, delete_ms, error = result
        record = EvictionRecord(
            node=self.node, id=record_id(trigger_id, pod), pod=pod, reason=action.reason,
            owner=action.owner, containers=tuple(progress.containers.get(pod, ())),
            kill_ms=round(progress.kill_ms, 3), delete_ms=round(delete_ms, 3),
            total_ms=round((time.time() - received) * 1000, 3), trigger_id=trigger_id,
            outcome=outcome, error=error, tasks_dead_ms=_since(received, progress.dead_at),
            released_ms=_since(received, progress.released_at))
        await self.outbox.publish_once(self.subject, record)
        self.metrics.evictions.labels(action.reason, outcome).inc()
        log.info("evicted", node=self.node, pod=pod, reason=action.reason, owner=action.owner,
                 outcome=outcome, kill_ms=record.kill_ms, total_ms=record.total_ms)


def _pods(action: Reclaim, progress: ReclaimProgress) -> list[str]:
    """The pods of a reclaim: those the plan names, then those the kubelet named."""
    return list(dict.fromkeys([*action.pods, *progress.found]))


def _since(start: float, at: float) -> float:
    return round(max(0.0, at - start) * 1000, 3) if at else 0.0
