"""The solver wired together: consume events, persist, execute, recover after a restart.

For each event (at least once, in order, from the durable consumer):

1. a plan already pending for this event id -> resume it; an id already
   applied -> nothing (a redelivery or a replay);
2. ``handle`` changes the state and returns actions;
3. the MappingCache, desired health, journal and the plan are written to the
   key-value buckets together, *before* any action runs;
4. the plan runs; it is deleted when finished. A failure that may pass
   (Kubernetes, containerd, kmod-bridge unreachable) naks the message, and
   the redelivery resumes the plan.

On start: load the buckets, finish every pending plan, rebuild the cache from
the node's pods when its bucket was empty, then reconcile the cache with the
pods that exist on the node.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import msgspec
from gpushare_common.adapters.kube import KubeError
from gpushare_common.adapters.podresources import PodResourcesError
from gpushare_common.bus import BUGS, Bus, Store
from gpushare_common.cardmap import card_map
from gpushare_common.events import (
    AnyEvent,
    CardInventory,
    DeviceHealth,
    Health,
    ReservedEvent,
    ShadowEvent,
    SpotEvent,
    event_tag,
)
from gpushare_common.ids import IdError, load_key
from gpushare_common.logging import get_logger
from gpushare_common.mapping import PersistentMapping
from gpushare_common.pods import PodRules
from gpushare_common.retry import Backoff, Supervised
from prometheus_client import CollectorRegistry

from .actions import DeviceList, Plan, Reclaim
from .cards import kubelet_view
from .executor import Executor
from .handlers import handle
from .journal import JournalDoc, Seen
from .metrics import SolverMetrics
from .nodepods import NodePods, read_pods
from .outbox import BusOutbox
from .ports import Allocations, PodApi, TaskApi
from .rebuild import rebuild
from .reclaim import Reclaimer
from .reconcile import reconcile
from .settings import SolverSettings
from .state import HandlerError, SolverState
from .taints import DeviceTaints

log = get_logger("solver")
_PERSISTED_SEEN = 256
# the solver's state in its buckets: scope (after the node) -> bucket
_STORES = {"mapping": "solver", "plan": "solver", "journal": "solver", "health": "health"}
_JOURNAL = "state"
_WRITE_ON_STOP_S = 2.0  # a state write cut by a stop may end this long (the skeleton waits 5 s for a task)


async def _settled(persisting: asyncio.Future[None]) -> None:
    await asyncio.shield(persisting)


class Solver:
    def __init__(self, node: str, settings: SolverSettings, bus: Bus, pods: PodApi, tasks: TaskApi,
                 registry: CollectorRegistry, rules: PodRules | None = None,
                 allocations: Allocations | None = None) -> None:
        self.node, self.settings, self.bus, self.pods = node, settings, bus, pods
        self.rules = rules or PodRules()
        self.state = SolverState(spot_resource=settings.spot_resource)
        self.allocations = allocations
        if allocations is None:
            self.state.kubelet = None  # no kubelet to ask: nothing is lent
        self.metrics = SolverMetrics(registry)
        self.seen = Seen(settings.seen_events)
        self.plans: dict[str, Plan] = {}
        outbox = BusOutbox(bus, node, settings.kmod_timeout_s, settings.fence_timeout_s)
        self.reclaimer = Reclaimer(node, settings, pods, tasks, outbox,
                                   bus.subjects.eviction(node), self.metrics, lambda: self.state.evicting,
                                   allocations, self.rules, self.state.evicted)
        taints = DeviceTaints(node, pods) if settings.dra_taints else None  # type: ignore[arg-type]
        self.executor = Executor(node, bus.subjects, pods, self.reclaimer.outbox, self.reclaimer, taints)
        self._stores: dict[str, Store] = {}
        self.mapping: PersistentMapping | None = None
        self._saved_health: dict[str, Health] = {}
        self.rebuild_needed = False  # the mapping bucket was empty at start
        self._lock = asyncio.Lock()

    # --- start-up -------------------------------------------------------------

    async def open(self) -> None:
        for kind, bucket in _STORES.items():
            self._stores[kind] = await self.bus.store(bucket, self.bus.layout.scope(self.node, kind))
        self.mapping = PersistentMapping(self._stores["mapping"])
        self.rebuild_needed = await self.mapping.load() == 0
        self.state.cache = self.mapping.cache
        spot = await self._stores["health"].get(self.settings.spot_resource, DeviceHealth)
        self.state.health = dict(spot.devices) if spot else {}
        self._saved_health = dict(self.state.health)
        journal = await self._stores["journal"].get(_JOURNAL, JournalDoc) or JournalDoc()
        self.seen.load(journal.seen)
        self.state.terminating = set(journal.terminating)
        self.state.inventory = {r: tuple(c) for r, c in journal.inventory.items()}
        self.state.shadow_cards = {s: tuple(c) for s, c in journal.shadow_cards.items()}
        self.state.dra_shared = {r: tuple(c) for r, c in journal.dra_shared.items()}
        self.state.lend_after = journal.lend_after
        self.plans = await self._stores["plan"].items(Plan)
        self.state.evicting = dict(journal.evicting)
        self._prune_evicting()
        log.info("state loaded", node=self.node, owners=len(self.state.cache.owners()),
                 pending_plans=len(self.plans))

    async def recover(self) -> None:
        """Finish pending plans, reconcile with the cluster, republish the desired health."""
        for plan in sorted(self.plans.values(), key=lambda p: p.received):
            await self._resume(plan, at_start=True)
        await self._reconcile()
        for borrower in sorted(set(self.state.borrowers().values())):
            await self._learn(borrower)
        if self.state.health:
            event = DeviceHealth(node=self.node, resource=self.settings.spot_resource,
                                 devices=dict(self.state.health), full=True, reason="solver start")
            await self.bus.publish(self.bus.subjects.health(self.node, self.settings.spot_resource), event)

    async def _resume(self, plan: Plan, at_start: bool = False) -> bool:
        """Run a pending plan again; True when it is done. Only a plan that contradicts the state
        is dropped: any other failure keeps it pending (its event's redelivery, or
        :meth:`resume_pending`, runs it again), since its event id is already applied and the
        eviction it carries would otherwise never happen."""
        try:
            await self._execute(plan)
        except HandlerError as err:
            log.error("pending plan contradicts the state; dropped", node=self.node, trigger=plan.trigger_id,
                      reason=err.reason)  # fmt: skip
            await self._forget(plan)
        except Exception as err:  # a plan is a boundary: any other failure may pass, the plan stays
            keys = {"node": self.node, "trigger": plan.trigger_id, "at_start": at_start, "error": repr(err)}
            if isinstance(err, BUGS):
                log.exception("bug in a pending plan; kept and tried again", **keys)
            else:
                log.warning("pending plan failed; kept and tried again", **keys)
            return False
        return True

    async def resume_pending(self, stop: asyncio.Event) -> None:
        """Keep running the plans still pending (failed at start, or of no stream event: reconcile,
        pressure) with a growing delay, until each is done."""
        first = self.settings.retry_first_s * 10
        async for attempt in Supervised("resume the pending plans", stop, Backoff(first, self.settings.retry_max_s),
                                        every_s=first, node=self.node):  # fmt: skip
            if not self.plans:
                continue
            async with self._lock:
                results = [await self._resume(plan) for plan in sorted(self.plans.values(), key=lambda p: p.received)
                           if plan.trigger_id in self.plans]  # fmt: skip
            if all(results):
                attempt.progress()
            else:
                attempt.failed(f"{results.count(False)} plan(s) still pending")

    async def _reconcile(self) -> None:
        try:
            pods, _ = await self.pods.list_pods(field_selector=f"spec.nodeName={self.node}")
        except KubeError as err:
            log.warning("cannot list pods; reconciliation skipped", node=self.node, error=str(err))
            return
        read = read_pods(pods, self.rules, self.node)
        async with self._lock:
            await self._ask_kubelet()
            actions = self._rebuild(read) if self.rebuild_needed else []
            actions += reconcile(self.state, self.node, read.present())
            await self._run(f"reconcile-{uuid.uuid4().hex}", "reconcile", actions, time.time())
            self._cards_changed()

    def _cards_changed(self) -> None:
        """The sharing and lending map, for the metrics (``gpushare_card_*``)."""
        self.metrics.cards.update(card_map(self.state.cache, self.state.inventory, self.state.shadow_cards,
                                           self.state.health, self.state.dra_shared))

    def _rebuild(self, pods: NodePods) -> list[Any]:
        """An empty bucket: what the pods tell; the rest comes with the detector's republication,
        which the ids remembered must not drop."""
        actions, found = rebuild(self.state, pods, self._signing_key())
        self.seen = Seen(self.settings.seen_events)
        self.rebuild_needed = False
        if found.unknown_holders:  # who holds which card comes with the detector's republication
            self.state.lend_after = time.time() + self.settings.rebuild_holdoff_s
        log.info("mapping rebuilt from the cluster", node=self.node, shadow_pods=found.shadow_pods,
                 users=found.users, borrowers=found.borrowers, unknown_holders=found.unknown_holders,
                 skipped=",".join(f"{r}={n}" for r, n in sorted(found.skipped.items())))
        return actions

    def _signing_key(self) -> bytes | None:
        if not self.settings.signing_key_file:
            return None
        try:
            return load_key(self.settings.signing_key_file)
        except IdError as err:
            log.warning("signing key unusable; borrowers left to the detector", node=self.node, error=str(err))
            return None

    # --- events ---------------------------------------------------------------

    async def on_event(self, event: AnyEvent) -> None:
        tag = event_tag(event)
        async with self._lock:
            pending = self.plans.get(event.id)
            if pending is not None:
                await self._execute(pending)
                return
            if event.id in self.seen and not isinstance(event, CardInventory):  # idempotent by content
                self.metrics.events.labels(tag, "duplicate").inc()
                return
            received = time.time()
            if _may_lend(event):
                await self._ask_kubelet()
            try:
                actions = handle(event, self.state)
            except HandlerError as err:
                self.metrics.events.labels(tag, "rejected").inc()
                log.error("event rejected", node=self.node, event=tag, id=event.id, reason=err.reason)
                raise
            self.seen.add(event.id)
            self._count_withheld(tag)
            await self._run(event.id, tag, actions, received)
            self.metrics.events.labels(tag, "applied").inc()
            self._cards_changed()
            if isinstance(event, SpotEvent) and event.state == "using" and not actions:
                await self._learn(event.pod)
            elif isinstance(event, SpotEvent) and event.state == "cleared":
                self.reclaimer.forget(event.pod)

    async def _ask_kubelet(self) -> None:
        """Who holds which card, as the kubelet says now (before an event that may lend one)."""
        if self.allocations is None:
            return
        try:
            listing = await self.allocations.list()
        except PodResourcesError as err:
            self.state.kubelet = None
            self.metrics.lend_withheld.labels("kubelet-unreadable").inc()
            log.warning("pod-resources unreadable: no card is lent until the kubelet answers", node=self.node,
                        error=str(err))
            return
        self.state.kubelet = kubelet_view(listing, self.rules, self.state.inventory)

    def _count_withheld(self, tag: str) -> None:
        if self.state.withheld:
            self.metrics.lend_withheld.labels("held").inc(len(self.state.withheld))
            log.warning("cards not lent: the kubelet says a container holds them", node=self.node, event=tag,
                        cards=",".join(sorted(self.state.withheld)))
            self.state.withheld.clear()

    async def _learn(self, pod: str) -> None:
        try:
            await self.reclaimer.learn(pod)
        except KubeError as err:
            log.info("could not read a borrower's containers ahead", node=self.node, pod=pod, error=str(err))

    async def _run(self, trigger_id: str, tag: str, actions: list[Any], received: float) -> None:
        """Write the state and the plan while the plan starts: a kill never waits for the bucket.

        A reclaim saves its progress only once this write is done. Should the solver die
        before, the event was not acknowledged: its redelivery recomputes the same plan from the
        state last written, and every action is idempotent.
        """
        plan = Plan(trigger_id=trigger_id, event=tag, actions=actions, received=received) if actions else None
        persisting = asyncio.ensure_future(self._persist(plan))
        try:
            if plan is not None:
                await self._execute(plan, persisting)
            await _settled(persisting)
        except asyncio.CancelledError:  # a stop mid-event: the state goes to the buckets whole
            await self._finish_write(persisting, trigger_id, tag)
            raise
        finally:
            if not persisting.done():
                persisting.cancel()

    async def _finish_write(self, persisting: asyncio.Future[None], trigger_id: str, tag: str) -> None:
        """Let the state write that a stop cut into end (``_WRITE_ON_STOP_S`` at most). Cut half way,
        the journal may name the event applied (with a ShadowPod's cards) while its MappingCache
        entries are not written: the event's redelivery is then dropped as a duplicate, and the
        restarted solver, which no longer knows the ShadowPod, lends its card."""
        done, _ = await asyncio.wait({persisting}, timeout=_WRITE_ON_STOP_S)
        error = None if not done or persisting.cancelled() else persisting.exception()
        if not done or error is not None:
            log.warning("stopped while the state of an event was written; written in part", node=self.node,
                        trigger=trigger_id, event=tag, error=repr(error) if error else "timed out")

    async def _persist(self, plan: Plan | None) -> None:
        assert self.mapping is not None
        writes = [self.mapping.flush(), self._save_journal()]
        if plan is not None:
            writes.append(self._stores["plan"].put(plan.trigger_id, plan))
            writes += [self._save_device_list(a) for a in plan.actions if isinstance(a, DeviceList)]
        if self.state.health and self.state.health != self._saved_health:
            self._saved_health = dict(self.state.health)
            spot = DeviceHealth(node=self.node, resource=self.settings.spot_resource,
                                devices=dict(self.state.health), full=True)
            writes.append(self._stores["health"].put(self.settings.spot_resource, spot))
        await asyncio.gather(*writes)

    async def _save_journal(self) -> None:
        doc = JournalDoc(seen=self.seen.recent(_PERSISTED_SEEN), terminating=sorted(self.state.terminating),
                         inventory={r: list(c) for r, c in self.state.inventory.items()},
                         shadow_cards={s: list(c) for s, c in self.state.shadow_cards.items()},
                         dra_shared={r: list(c) for r, c in self.state.dra_shared.items()},
                         lend_after=self.state.lend_after, evicting=dict(self.state.evicting))
        await self._stores["journal"].put(_JOURNAL, doc)

    async def _save_device_list(self, action: DeviceList) -> None:
        event = DeviceHealth(node=self.node, resource=action.resource, full=True, reason=action.reason,
                             devices=dict.fromkeys(action.devices, "Healthy"))
        await self._stores["health"].put(action.resource, event)

    async def _execute(self, plan: Plan, persisting: asyncio.Future[None] | None = None) -> None:
        self.plans[plan.trigger_id] = plan
        self.metrics.in_flight.set(len(self.plans))

        async def save(current: Plan) -> None:
            if persisting is not None:
                await _settled(persisting)
            await self._save_plan(current)

        try:
            await self.executor.run(plan, save)
            if persisting is not None:
                await _settled(persisting)
        except Exception as err:  # the event's redelivery resumes the plan from its saved progress
            log.warning("plan interrupted; will resume", node=self.node, trigger=plan.trigger_id,
                        error=str(err))
            raise
        await self._forget(plan)

    async def _save_plan(self, plan: Plan) -> None:
        await self._stores["plan"].put(plan.trigger_id, plan)

    async def _forget(self, plan: Plan) -> None:
        self.plans.pop(plan.trigger_id, None)
        await self._stores["plan"].delete(plan.trigger_id)
        if self._prune_evicting():
            await self._save_journal()
        self.metrics.in_flight.set(len(self.plans))
        self.metrics.borrowers.set(len(self.state.borrowers()))

    def _prune_evicting(self) -> bool:
        """A pod stays ``evicting`` only while a pending plan names it: once its reclaim is done
        (or its plan dropped) it is gone or refused. True when something was dropped."""
        named = {pod for plan in self.plans.values() for action in plan.actions if isinstance(action, Reclaim)
                 for pod in action.pods}
        stale = [pod for pod in self.state.evicting if pod not in named]
        for pod in stale:
            del self.state.evicting[pod]
        return bool(stale)

    async def evict(self, trigger_id: str, reason: str, pods: dict[str, str], over: tuple[str, ...] = ()) -> None:
        """Evict pods (key -> uid) outside any event of the stream (pressure, ``over`` the resources
        short): a plan of one reclaim."""
        async with self._lock:
            for pod, uid in pods.items():
                self.state.take_out(pod, uid=uid)
            await self._run(trigger_id, reason, [Reclaim(reason=reason, pods=tuple(pods), over=over)], time.time())
            self._cards_changed()

    # --- /status --------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "mapping": self.state.cache.snapshot(),
            "borrowers": self.state.borrowers(),
            "spot_health": dict(sorted(self.state.health.items())),
            "terminating_shadow_pods": sorted(self.state.terminating),
            "evicting": {p: msgspec.structs.asdict(v) for p, v in sorted(self.state.evicting.items())},
            "card_inventory": {r: list(c) for r, c in sorted(self.state.inventory.items())},
            "shadow_cards": {s: list(c) for s, c in sorted(self.state.shadow_cards.items())},
            "dra_shared": {r: list(c) for r, c in sorted(self.state.dra_shared.items())},
            "evictions_in_flight": [_plan_view(p) for p in self.plans.values()],
        }


def _may_lend(event: AnyEvent) -> bool:
    """Events whose handling may lend a card: the kubelet is asked who holds what first."""
    match event:
        case CardInventory() | ShadowEvent(state="cleared") | ReservedEvent(state="cleared"):
            return True
    return False


def _plan_view(plan: Plan) -> dict[str, Any]:
    reclaims = []
    for index, action in enumerate(plan.actions):
        if isinstance(action, Reclaim):
            progress = plan.progress.get(index)
            reclaims.append({"reason": action.reason, "owner": action.owner, "pods": list(action.pods),
                             "killed": bool(progress and progress.killed),
                             "released": bool(progress and progress.released)})
    return {"trigger": plan.trigger_id, "event": plan.event, "done": plan.done,
            "actions": len(plan.actions), "reclaims": reclaims}
