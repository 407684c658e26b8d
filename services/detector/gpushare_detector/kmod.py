"""Talk to the kmod-bridge: which containers gpushare placed on cards (add/delete), and their
GPU-call counts."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from gpushare_common import events as ev
from gpushare_common.bus import BusError
from gpushare_common.logging import get_logger
from gpushare_common.retry import Backoff, Supervised
from gpushare_common.subjects import Subjects

from .metrics import DetectorMetrics

log = get_logger("detector.kmod")


class Requester(Protocol):
    subjects: Subjects

    async def request(self, subject: str, event: ev.Event, timeout: float = 2.0) -> ev.AnyEvent: ...


class KmodSync:
    """Keeps the bridge's watch set equal to the containers gpushare placed on the node's cards,
    each with its placement (owners; sharers and borrowers, counted only); retries with backoff."""

    def __init__(self, bus: Requester, node: str, timeout_s: float, metrics: DetectorMetrics) -> None:
        self.bus = bus
        self.node = node
        self.timeout_s = timeout_s
        self.metrics = metrics
        self.wanted: dict[str, ev.Placement] = {}
        self.sent: dict[str, ev.Placement] = {}
        self.changed = asyncio.Event()
        self._loop: Supervised | None = None
        self.last_error = ""

    def want(self, placements: Mapping[str, ev.Placement]) -> None:
        if placements != self.wanted:
            self.wanted = dict(placements)
            self.changed.set()
            if self._loop is not None and self._loop.failures:
                self._loop.restart()  # news: send it now, not after another container's backoff

    def resend(self) -> None:
        """Send every container again (the bridge may have restarted); deletes stay done."""
        self.sent.clear()
        self.changed.set()

    async def request(self, op: ev.KmodOp, pods: tuple[str, ...],
                      placements: tuple[ev.Placement, ...] = ()) -> ev.KmodReply | None:
        return await self._send(ev.KmodCommand(node=self.node, op=op, pods=pods, reason="detector",
                                               placements=placements))

    async def _send(self, command: ev.KmodCommand) -> ev.KmodReply | None:
        op = command.op
        try:
            subject = self.bus.subjects.kmod_requests(self.node, "detector")  # its own role's subject
            reply = await self.bus.request(subject, command, self.timeout_s)
        except BusError as err:
            self._failed(op, "no-reply", str(err))
            return None
        if not isinstance(reply, ev.KmodReply) or reply.status != 0:
            message = getattr(reply, "message", type(reply).__name__)
            self._failed(op, "refused", f"status {getattr(reply, 'status', '?')}: {message}")
            return None
        self.metrics.kmod.labels(op, "ok").inc()
        self.last_error = ""
        return reply

    def _failed(self, op: str, outcome: str, error: str) -> None:
        self.metrics.kmod.labels(op, outcome).inc()
        if error != self.last_error:
            log.warning("kmod-bridge request failed", node=self.node, op=op, error=error)
        self.last_error = error
        return None

    async def sync_once(self) -> bool:
        """Add what is wanted and not sent as it is wanted (owners first: they never wait behind
        a sharer's container), delete what is sent and not wanted; False when some of it must be
        tried again."""
        changed = [p for key, p in sorted(self.wanted.items()) if self.sent.get(key) != p]
        ok = True
        for batch in ([p for p in changed if not ev.counted_only(p.role)],
                      [p for p in changed if ev.counted_only(p.role)]):  # fmt: skip
            if batch:
                ok = await self._add(batch) and ok
        delete = tuple(sorted(set(self.sent) - set(self.wanted)))
        if delete:
            done = await self.request("delete", delete) is not None
            if done:
                for key in delete:
                    self.sent.pop(key, None)
            ok = ok and done
        return ok

    async def _add(self, batch: list[ev.Placement]) -> bool:
        """A container the bridge found no pid namespace for (not started yet: pod-resources lists
        a pod's devices before its containers run) is not sent: it is asked for again with the
        backoff, not left unwatched until the next resync."""
        keys = tuple(p.container for p in batch)
        reply = await self.request("add", keys, tuple(batch))
        unresolved = set(reply.unresolved) if reply is not None else set(keys)
        self.sent.update({p.container: p for p in batch if p.container not in unresolved})
        if unresolved and reply is not None:
            self._failed("add", "unresolved", f"no pid namespace yet for {', '.join(sorted(unresolved))}")
        return not unresolved

    async def run(self, stop: asyncio.Event, backoff_s: float = 1.0, max_backoff_s: float = 30.0) -> None:
        """Send the watch set's changes as they come, again with backoff until the bridge took them
        (e.g. a container without a pid namespace yet); a change of the wanted set (a new owner)
        is sent at once, not after the backoff of another container's retry."""
        self._loop = Supervised("send the watch set to the kmod-bridge", stop, Backoff(backoff_s, max_backoff_s),
                                wake=self.changed, node=self.node)  # fmt: skip
        async for sync in self._loop:
            if await self.sync_once():
                sync.progress()
            else:
                sync.failed(self.last_error or "not applied")

    async def stats(self, containers: tuple[str, ...], pids: tuple[int, ...] = ()
                    ) -> tuple[list[ev.NamespaceStats], dict[int, tuple[str, str]]] | None:
        """The kernel's counters of these containers' pid namespaces (``ns/pod/container``), each
        naming its pod, container and role, and the container (pod, name) of each of ``pids`` the
        bridge found; None when the bridge did not answer."""
        if not containers and not pids:
            return [], {}
        command = ev.KmodCommand(node=self.node, op="stats", pods=containers, reason="detector", pids=pids)
        reply = await self._send(command)
        if reply is None:
            return None
        return list(reply.stats), {p.pid: (p.pod, p.container) for p in reply.processes}

    def status(self) -> dict[str, object]:
        pending = sum(1 for key in self.wanted.keys() | self.sent.keys() if self.wanted.get(key) != self.sent.get(key))
        roles: dict[str, int] = {}
        for where in self.sent.values():
            roles[where.role] = roles.get(where.role, 0) + 1
        return {"containers": sorted(self.sent), "pending": pending, "last_error": self.last_error, "roles": roles}
