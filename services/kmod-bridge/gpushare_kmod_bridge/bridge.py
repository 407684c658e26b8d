"""The bridge between NATS and the kernel: commands in, owner-back events out.

- ``responder(role)``: the requests of one role (its own subject,
  ``kmod.<role>``); an operation that role does not own (``subjects.KMOD_OPS``:
  the detector adds, deletes and reads counters, the solver detects, holds and
  releases) is refused with ``-EPERM`` and counted, whatever the permissions
  let through; an undecodable request is answered ``-EINVAL`` (the bus).
- ``serve_command``: a :class:`KmodCommand` (pid-namespace ids and/or pod
  keys, resolved here) updates the watch set, goes to the kernel, and the
  kernel's status comes back as a :class:`KmodReply`. ADD and DETECT name,
  with each namespace, a live process of its container (the kernel checks it
  and pins the namespace); a namespace without one is refused (``-ESRCH``)
  and not remembered, as is one the kernel refused. When the kernel is not
  registered the watch set still changes (it is re-sent on registration) and
  the reply says ``-ENOTCONN``.
- ``on_notice``: each kernel notice becomes one :class:`OwnerBackEvent` on
  ``<prefix>.<node>.event.ownerback``, resolved to its pod when possible, and
  handed to ``publish``, which must not return before the stream has it (or
  must queue it for a task that does). Its id comes from the node, namespace
  and hit time, so a notice the kernel sends again on registration is the
  same event. The bridge is the one holder of the owner: from the notice until
  the solver answers (RELEASE or DELETE of that namespace, sent once the
  borrowers are dead) it sends HOLD every third of the kernel's
  ``timeout_ms``, and the kernel itself ends the holding at hit +
  ``max_hold_ms`` (the module's parameters, read from its replies: the one
  source of the bound). The owner-back may wait on a solver restart or slow
  borrowers for longer than ``timeout_ms``, and the owner must not run beside
  borrowers nobody has killed yet. A notice from
  a namespace whose entry is stale (another container lives there now)
  wakes the caller at once (DELETE) and publishes nothing.
- ``on_registered``: the ioctl filter when one is configured, then the watch
  set again with fresh pids (ADD, then DETECT; a detected namespace still
  being reclaimed is only added, its notice comes again); an entry whose
  container has no live process, or that the kernel refuses, is dropped. The
  link may register before the watch set is read back from NATS (holding an
  owner needs neither): the set is then sent by ``watch_set_loaded``.
- counted only: an ``add`` places each container (``KmodCommand.placements``); the namespace
  of a sharer or a borrower is counted (its GPU calls, per pod, for the metrics and the
  detector) and never detected or held: ``detect`` or ``hold`` naming one is refused with
  ``-EPERM``, and a notice from one (it can come only from a namespace detected before it was
  placed) wakes its caller at once and publishes nothing.
- ``prune``: after every refresh of the container map, entries bound to a
  container that is gone, or whose namespace another container now has, are
  dropped here and in the kernel. ``delete``, ``undetect`` and ``release`` by
  pod key also reach the namespaces recorded for a pod that is already gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
from gpushare_common import events
from gpushare_common.hold import HoldTiming
from gpushare_common.logging import get_logger
from gpushare_common.subjects import KMOD_OPS

from . import handlers, protocol
from .link import KernelLink, KernelUnavailable
from .metrics import BridgeMetrics, CallCount
from .resolver import ResolveError, Resolver, Snapshot, split_key
from .watchset import Owned, WatchEntry, WatchSet

log = get_logger("kmod-bridge")

Publish = Callable[[str, events.Event], Awaitable[None]]
_BY_RECORD = ("delete", "undetect", "release", "hold")  # ops that also reach namespaces of pods gone
_ANSWERS = ("release", "delete")  # ops that end the bridge's hold of an owner
_OWNERS_ONLY = ("detect", "hold")  # ops refused for a counted-only (a sharer's, a borrower's) namespace


class Bridge:
    def __init__(self, node: str, subject: str, publish: Publish, watchset: WatchSet,
                 resolver: Resolver, metrics: BridgeMetrics,
                 filter_config: protocol.FilterConfig | None = None) -> None:
        self.node = node
        self._holding: dict[int, asyncio.Task[None]] = {}
        self.subject = subject
        self.publish = publish
        self.watchset = watchset
        self.resolver = resolver
        self.metrics = metrics
        self.filter_config = filter_config
        self.link: KernelLink | None = None
        self.last_notice: dict[str, Any] = {}
        self.loaded = False  # the watch set was read back (until then registrations re-send nothing)
        self._noticed_early: set[int] = set()  # notices from namespaces before the set was read

    def attach(self, link: KernelLink) -> None:
        self.link = link

    # --- kernel -> NATS -------------------------------------------------------------

    async def on_notice(self, notice: protocol.Notice, received_ns: int) -> None:
        entry, loaded = self.watchset.get(notice.pidns), self.loaded
        owner = await self.resolver.owner(notice.pidns)
        same = None
        if entry is not None and entry.container_id:
            same = self.resolver.same_container(entry.container_id, notice.pid, notice.pidns)
            if same is None:  # no live pid of the recorded container known: list the node again
                owner = (await self.resolver.refresh(force=False)).owners.get(notice.pidns) or owner
                same = self.resolver.same_container(entry.container_id, notice.pid, notice.pidns)
        if same is False or (same is None and handlers.is_stale(entry, owner, self.resolver.snapshot)):
            self.metrics.stale.labels("notice").inc()
            log.warning("notice from a namespace that is no longer the watched container's; woken, "
                        "no owner-back", node=self.node, pidns=notice.pidns, pid=notice.pid,
                        watched=entry.pod if entry else "", now=owner.pod if owner else "")  # fmt: skip
            await self._drop([notice.pidns])
            return
        if entry is not None and entry.count_only:
            await self._counted_notice(entry)
            return
        pod, container = handlers.owner_of(entry, owner)
        event = handlers.owner_back(self.node, notice, pod, container, time.monotonic_ns())
        if notice.resent:
            log.info("notice sent again by the kernel", node=self.node, pidns=notice.pidns, id=event.id)
        await self.publish(self.subject, event)
        self._hold_until_answered(notice.pidns, pod, notice.ts_ns)
        self.metrics.published.labels(str(event.resolved).lower()).inc()
        self.metrics.latency.observe(event.notice_to_publish_ms / 1000)
        if entry is not None and entry.mode == "detected":
            await self.watchset.undetect([notice.pidns])  # the kernel cleared need_notice
            self._count_watched()
        elif entry is None and not loaded:  # its entry, read back later (or meanwhile), is detected no more
            await self._noticed_before_load(notice.pidns)
        self.last_notice = {"pidns": notice.pidns, "pid": notice.pid, "pod": pod,
                            "id": event.id, "latency_ms": round(event.notice_to_publish_ms, 3)}
        log.info("owner back", node=self.node, pod=pod or None, pidns=notice.pidns, pid=notice.pid,
                 resolved=event.resolved, latency_ms=round(event.notice_to_publish_ms, 3))

    async def _counted_notice(self, entry: WatchEntry) -> None:
        """A notice from a sharer's or a borrower's namespace: nobody's owner-back; its caller goes on."""
        self.metrics.errors.labels("counted-only-notice").inc()
        log.warning("notice from a namespace that is counted only; released, no owner-back", node=self.node,
                    pidns=entry.pidns, pod=entry.pod, role=entry.role)
        try:
            await self._link().request(protocol.CMD_RELEASE, [entry.pidns])
        except KernelUnavailable as err:  # the module's own timeout releases it
            log.info("kernel away while releasing a counted namespace", node=self.node, error=str(err))

    async def on_registered(self) -> None:
        link = self._link()
        if self.filter_config is not None:
            await link.request(protocol.CMD_CONFIG, config=self.filter_config)
        await self.resolver.refresh()  # the pids sent with the namespaces must be alive now
        if self.loaded:
            await self._resend()

    async def _noticed_before_load(self, pidns: int) -> None:
        if self.loaded:  # read back while this notice was handled
            await self.watchset.undetect([pidns])
            self._count_watched()
        else:
            self._noticed_early.add(pidns)

    async def watch_set_loaded(self) -> None:
        """The watch set is read back: entries whose notice came before are watched, not detected,
        and the whole set goes to the kernel when the link is registered already."""
        self.loaded = True
        await self.watchset.undetect(sorted(self._noticed_early))
        self._noticed_early.clear()
        self._count_watched()
        if self.link is not None and self.link.registered.is_set():
            try:
                await self._resend()
            except KernelUnavailable as err:  # the next registration sends it
                log.info("kernel away while sending the watch set", node=self.node, error=str(err))

    async def _resend(self) -> None:
        """The watch set again, with fresh pids: ADD, then DETECT (a detected namespace still
        being reclaimed is only added: its notice comes again)."""
        link = self._link()
        detected = self.watchset.by_mode("detected")
        kernel = [await link.request(protocol.CMD_STATS, chunk) for chunk in handlers.chunks(detected) if chunk]
        add, detect = handlers.resend_plan(self.watchset.entries.values(),
                                           {r.pidns: r.flags for reply in kernel for r in reply.stats})
        for ids, cmd in ((add, protocol.CMD_ADD), (detect, protocol.CMD_DETECT)):
            failed = await self._send_targets(cmd, ids)
            if failed:
                log.warning("watched namespaces dropped: no live process there, or the kernel refused",
                            node=self.node, reason=handlers.failures_message(failed))
                await self._drop(list(failed))
        log.info("watch set sent to the kernel", node=self.node, **self.watchset.counts())

    async def _send_targets(self, cmd: int, ids: Sequence[int]) -> dict[int, int]:
        """ADD/DETECT ``ids`` with a live process each: the failures, pidns -> -errno."""
        found, missing = handlers.targets(ids, self._containers, self.resolver.snapshot, self.resolver.pidns_of)
        if missing and ids:
            await self.resolver.refresh(force=False)  # a container started since the last listing
            again, missing = handlers.targets(missing, self._containers, self.resolver.snapshot,
                                              self.resolver.pidns_of)
            found += again
        chunks = [found[i : i + protocol.MAX_IDS] for i in range(0, len(found), protocol.MAX_IDS)]
        replies = [await self._link().request(cmd, targets=chunk) for chunk in chunks]
        statuses = handlers.target_statuses(chunks, replies)
        return {p: handlers.ESRCH for p in missing} | {p: s for p, s in statuses.items() if s < 0}

    def _containers(self, pidns: int) -> list[str]:
        """The containers a namespace is known to belong to: the recorded one, the one listed now."""
        entry = self.watchset.get(pidns)
        owner = self.resolver.snapshot.owners.get(pidns)
        return [entry.container_id if entry else "", owner.container_id if owner else ""]

    # --- NATS -> kernel -------------------------------------------------------------

    def responder(self, role: str) -> Callable[[events.AnyEvent], Awaitable[events.Event]]:
        """What answers the requests arriving on ``role``'s subject."""
        async def respond(request: events.AnyEvent) -> events.Event:
            op = request.op if isinstance(request, events.KmodCommand) else ""
            if op and op not in KMOD_OPS[role]:
                self.metrics.commands.labels(op, "wrong-role").inc()
                return self._reply(op, handlers.EPERM, (), f"op {op!r} is not the {role}'s to request "
                                   f"(the {role} may request {', '.join(KMOD_OPS[role])})")
            return await self.serve_command(request)

        return respond

    def undecodable(self, reason: str) -> events.KmodReply:
        """The answer to a request that does not decode (the caller learns why at once)."""
        self.metrics.commands.labels("?", "undecodable").inc()
        return self._reply("?", handlers.EINVAL, (), f"the request does not decode: {reason}")

    async def serve_command(self, request: events.AnyEvent) -> events.Event:
        if not isinstance(request, events.KmodCommand):
            got = events.event_tag(request)
            return self._reply("?", handlers.EINVAL, (), f"expected kmod_cmd, got {got}")
        op = request.op
        if op not in handlers.KERNEL_OPS:
            return self._reply(op, handlers.EINVAL, (), f"op {op!r} is not served (config is a setting)")
        try:
            ids, owners, unresolved = await self._resolve(request)
        except (ResolveError, protocol.ProtocolError) as err:
            return self._reply(op, handlers.EINVAL, request.pidns, str(err))
        if request.pods and not ids:
            if op in _BY_RECORD:  # nothing watched for these pods (any more): nothing to undo
                return self._reply(op, 0, (), f"nothing recorded for {list(request.pods)}")
            return self._reply(op, handlers.ENOENT, (), f"no pid namespace found for {list(request.pods)}")
        if op in _OWNERS_ONLY and (counted := self.watchset.counted_only(ids)):
            self.metrics.commands.labels(op, "counted-only").inc()
            return self._reply(op, handlers.EPERM, [e.pidns for e in counted], handlers.counted_only_message(counted))
        if op in _ANSWERS:
            self._answered(ids)
        if op != "stats":  # what changes the kernel's map or wakes a caller is always on record
            log.info("kmod command", node=self.node, op=op, reason=request.reason or None,
                     pods=",".join(request.pods) or None, pidns=",".join(map(str, ids)))  # fmt: skip
        if op in ("add", "detect"):
            return await self._watch(op, ids, owners, unresolved, handlers.placed_of(request.placements, owners))
        await self._remember(op, ids, owners)
        reply = await self._to_kernel(op, ids)
        if op == "stats" and request.pids:
            reply = msgspec.structs.replace(reply, processes=await self._processes(request.pids))
        return reply

    async def _processes(self, pids: Sequence[int]) -> tuple[events.ProcessOwner, ...]:
        """The container each host pid runs in (a vendor exporter's per-process figures are
        attributed to pods with it); a pid of no known container is left out."""
        found = []
        for pid in dict.fromkeys(pids):
            pidns = self.resolver.pidns_of(pid) if pid > 0 else None
            owner = await self.resolver.owner(pidns) if pidns is not None else None
            if owner is not None and owner.pod:
                found.append(events.ProcessOwner(pid=pid, pidns=pidns or 0, pod=owner.pod, container=owner.container))
        return tuple(found)

    async def _watch(self, op: str, ids: list[int], owners: dict[int, Owned], unresolved: list[str],
                     placed: dict[int, events.Placement]) -> events.KmodReply:
        """ADD/DETECT: only what the kernel took (or will be sent, when it is away) is remembered;
        the pods of the command with no pid namespace yet (a container not started) are named in
        the reply, so the sender asks again for them instead of taking them as watched."""
        await self._drop_replaced(ids, owners)
        try:
            failed = await self._send_targets(handlers.KERNEL_OPS[op], ids)
        except KernelUnavailable as err:
            self.metrics.commands.labels(op, "unavailable").inc()
            await self._remember(op, ids, owners, placed)
            return self._reply(op, handlers.ENOTCONN, ids, f"kernel module unavailable: {err}", unresolved)
        await self._remember(op, [p for p in ids if p not in failed], owners, placed)
        status = next(iter(failed.values()), 0)
        self.metrics.commands.labels(op, "ok" if status >= 0 else "error").inc()
        return self._reply(op, status, ids, handlers.failures_message(failed), unresolved)

    async def _resolve(self, request: events.KmodCommand) -> tuple[list[int], dict[int, Owned], list[str]]:
        """The command's pid namespaces, their owners, and its pods with no namespace found."""
        protocol.check_ids(request.pidns)
        recorded = [p for key in request.pods for p in self.watchset.of_pod(*split_key(key))] \
            if request.op in _BY_RECORD else []
        owners: dict[int, Owned] = {}
        resolved = await self.resolver.namespaces(request.pods)
        for key, found in resolved.items():
            for pidns in found:
                owner = self.resolver.snapshot.owners.get(pidns)
                owners[pidns] = (owner.pod, owner.container, owner.container_id) if owner \
                    else (*split_key(key), "")
        ids = list(dict.fromkeys([*request.pidns, *owners, *recorded]))
        protocol.check_ids(ids)
        return ids, owners, [key for key, found in resolved.items() if not found]

    async def _drop_replaced(self, ids: Sequence[int], owners: dict[int, Owned]) -> None:
        """An entry recorded for another container than the one living in its namespace now (the
        kernel reused an inode it did not hold) starts afresh."""
        replaced = [p for p in owners if _replaced(self.watchset.get(p), owners[p])]
        if replaced:
            self.metrics.stale.labels("command").inc(len(replaced))
            log.warning("namespaces recorded for another container than the one there now; started afresh",
                        node=self.node, pidns=",".join(map(str, replaced)),
                        recorded=",".join(self.watchset.entries[p].container_id[:12] for p in replaced
                                          if p in self.watchset.entries),
                        now=",".join(owners[p][2][:12] for p in replaced))  # fmt: skip
            await self._drop(replaced)

    async def _remember(self, op: str, ids: Sequence[int], owners: dict[int, Owned],
                        placed: dict[int, events.Placement] | None = None) -> None:
        if op == "add":
            fresh = [p for p in ids if self.watchset.get(p) is None]
            await self.watchset.set_mode(fresh, "watched", owners)
            await self.watchset.place({p: where for p, where in (placed or {}).items() if p in ids})
        elif op == "detect":
            await self.watchset.set_mode(ids, "detected", owners)
        elif op == "undetect":
            await self.watchset.undetect(ids)
        elif op == "delete":
            await self.watchset.remove(ids)
        self._count_watched()

    async def _to_kernel(self, op: str, ids: Sequence[int]) -> events.KmodReply:
        link = self._link()
        replies: list[protocol.Reply] = []
        try:
            for chunk in handlers.chunks(ids):
                replies.append(await link.request(handlers.KERNEL_OPS[op], chunk))
        except KernelUnavailable as err:
            self.metrics.commands.labels(op, "unavailable").inc()
            return self._reply(op, handlers.ENOTCONN, ids, f"kernel module unavailable: {err}")
        status = handlers.combine([r.header.status for r in replies])
        self.metrics.commands.labels(op, "ok" if status >= 0 else "error").inc()
        for reply in replies:
            link.note_timing(reply)
        return handlers.reply_event(self.node, op, status, ids, link.timing, "", replies, self.who_of)

    def _reply(self, op: str, status: int, ids: Sequence[int], message: str,
               unresolved: Sequence[str] = ()) -> events.KmodReply:
        if status < 0:
            log.warning("kmod command refused", node=self.node, op=op, status=status, reason=message)
        timing = self.link.timing if self.link is not None else HoldTiming()
        return handlers.reply_event(self.node, op, status, ids, timing, message, unresolved=unresolved)

    # --- forgetting what is gone -----------------------------------------------------

    async def prune(self, snapshot: Snapshot) -> None:
        """Drop the entries whose container is gone or whose namespace another container has."""
        stale = [p for p, e in self.watchset.entries.items()
                 if handlers.is_stale(e, snapshot.owners.get(p), snapshot)]  # fmt: skip
        if stale:
            self.metrics.stale.labels("refresh").inc(len(stale))
            log.info("forgetting namespaces of containers that are gone", node=self.node,
                     containers=",".join(self.watchset.entries[p].container_id[:12] for p in stale),
                     pidns=",".join(map(str, stale)),
                     pods=",".join(sorted({self.watchset.entries[p].pod for p in stale})))  # fmt: skip
            await self._drop(stale)

    async def _drop(self, ids: list[int]) -> None:
        self._answered(ids)
        await self.watchset.remove(ids)
        self._count_watched()
        try:
            for chunk in handlers.chunks(ids):
                await self._link().request(protocol.CMD_DELETE, chunk)
        except KernelUnavailable as err:  # a module loaded again starts with an empty map
            log.info("kernel away while forgetting namespaces", node=self.node, error=str(err))

    # --- holding an owner until the solver answers ------------------------------------

    def _hold_until_answered(self, pidns: int, pod: str, hit_ns: int) -> None:
        if pidns in self._holding and not self._holding[pidns].done():
            return
        self._holding[pidns] = asyncio.ensure_future(self._hold(pidns, pod, hit_ns))

    def _answered(self, ids: Sequence[int]) -> None:
        for pidns in ids:
            task = self._holding.pop(pidns, None)
            if task is not None:
                task.cancel()

    async def _hold(self, pidns: int, pod: str, hit_ns: int) -> None:
        """HOLD ``pidns`` every third of the kernel's ``timeout_ms``, counted from the hit (a
        notice sent again after a restart may be late: its first HOLD goes at once), until the
        solver answers (the task is cancelled) or the kernel holds the owner no longer: released
        meanwhile, or ``max_hold_ms`` after the hit, when the owner continues even unanswered.
        The hit's time is the kernel's CLOCK_MONOTONIC, this process's monotonic clock."""
        held = 0
        wait_s = max(0.0, (hit_ns - time.monotonic_ns()) / 1e9 + self._link().timing.hold_every_s)
        try:
            while True:
                await asyncio.sleep(wait_s)
                wait_s = self._link().timing.hold_every_s
                reply = await self._link().request(protocol.CMD_HOLD, [pidns])
                self._link().note_timing(reply)
                if reply.header.status <= 0:
                    self._held_no_longer(pidns, pod, reply, held)
                    return
                held += 1
                self.metrics.holds.inc()
                if held == 1:
                    log.info("holding the owner until the solver answers", node=self.node, pod=pod or None,
                             pidns=pidns, every_s=round(self._link().timing.hold_every_s, 3))
        except KernelUnavailable:
            return  # the module sends the notice again on registration: the next session holds it
        finally:
            if self._holding.get(pidns) is asyncio.current_task():
                del self._holding[pidns]

    def _held_no_longer(self, pidns: int, pod: str, reply: protocol.Reply, held: int) -> None:
        """A HOLD that moved nothing: the reclaim ended (nothing to say), or it reached the
        kernel's ``max_hold_ms`` while the solver has not answered: the owner continues at that
        deadline, maybe beside borrowers still alive."""
        if not any(r.pidns == pidns and r.flags & protocol.F_RECLAIMING for r in reply.stats):
            return
        self.metrics.unanswered.inc()
        log.error("owner-back unanswered for the kernel's max_hold_ms: the owner continues at its deadline",
                  node=self.node, pod=pod or None, pidns=pidns, holds=held,
                  max_hold_ms=self._link().timing.max_hold_ms)

    async def close(self) -> None:
        tasks = list(self._holding.values())
        self._answered(list(self._holding))
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- views ---------------------------------------------------------------------

    def who_of(self, pidns: int) -> handlers.Who:
        """(pod, container, role) of a namespace: who lives there, and where the detector placed it."""
        entry = self.watchset.get(pidns)
        pod, container = handlers.owner_of(entry, self.resolver.snapshot.owners.get(pidns))
        return pod, container, entry.role if entry is not None else ""

    def pod_of(self, pidns: int) -> str:
        return self.who_of(pidns)[0]

    def gpu_calls(self) -> list[CallCount]:
        """The GPU calls of each pid namespace of the kernel's last statistics, and its placement."""
        stats = self.link.last_stats if self.link is not None else None
        found = []
        for record in stats.stats if stats is not None else ():
            entry = self.watchset.get(record.pidns)
            pod, container, role = self.who_of(record.pidns)
            found.append(CallCount(pod, container, record.hits, role, ",".join(entry.cards) if entry else "",
                                   entry.shadow if entry else ""))  # fmt: skip
        return found

    def _count_watched(self) -> None:
        for mode, count in self.watchset.counts().items():
            self.metrics.watched.labels(mode).set(count)

    def _link(self) -> KernelLink:
        if self.link is None:
            raise KernelUnavailable("no kernel link attached")
        return self.link

    def status(self) -> dict[str, Any]:
        link = self.link
        return {
            "node": self.node,
            "transport": link.transport.name if link else "",
            "registered": bool(link and link.registered.is_set()),
            "registrations": link.registrations if link else 0,
            "last_error": link.last_error if link else "",
            "watch_set_unsaved": len(self.watchset.unsaved),
            "watch_set": [
                {"pidns": e.pidns, "mode": e.mode, "pod": e.pod, "container": e.container,
                 "container_id": e.container_id, "role": e.role, "cards": list(e.cards), "shadow": e.shadow}
                for e in sorted(self.watchset.entries.values(), key=lambda e: e.pidns)
            ],
            "last_notice": self.last_notice,
            "holding": sorted(self._holding),
            **handlers.stats_view(link.last_stats if link else None, self.pod_of),
        }


def _replaced(entry: WatchEntry | None, owner: Owned) -> bool:
    """An entry bound to another container than the one living in its namespace now."""
    return entry is not None and bool(entry.container_id) and bool(owner[2]) and entry.container_id != owner[2]
