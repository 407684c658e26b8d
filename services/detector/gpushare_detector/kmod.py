"""Talk to the kmod-bridge: which reserved containers exist (add/delete), and GPU-access statistics."""

from __future__ import annotations

import asyncio
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
    """Keeps the bridge's set of reserved containers equal to the node's; retries with backoff."""

    def __init__(self, bus: Requester, node: str, timeout_s: float, metrics: DetectorMetrics) -> None:
        self.bus = bus
        self.node = node
        self.timeout_s = timeout_s
        self.metrics = metrics
        self.wanted: set[str] = set()
        self.sent: set[str] = set()
        self.changed = asyncio.Event()
        self._loop: Supervised | None = None
        self.last_error = ""

    def want(self, containers: set[str]) -> None:
        if containers != self.wanted:
            self.wanted = set(containers)
            self.changed.set()
            if self._loop is not None and self._loop.failures:
                self._loop.restart()  # news: send it now, not after another container's backoff

    def resend(self) -> None:
        """Send every container again (the bridge may have restarted); deletes stay done."""
        self.sent.clear()
        self.changed.set()

    async def request(self, op: ev.KmodOp, pods: tuple[str, ...]) -> ev.KmodReply | None:
        command = ev.KmodCommand(node=self.node, op=op, pods=pods, reason="detector")
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
        """Add what is wanted and not sent, delete what is sent and not wanted; False when some of
        it must be tried again. A container the bridge found no pid namespace for (not started
        yet: pod-resources lists a pod's devices before its containers run) is not sent: it is
        asked for again with the backoff, not left unwatched until the next resync."""
        add = tuple(sorted(self.wanted - self.sent))
        delete = tuple(sorted(self.sent - self.wanted))
        ok = True
        if add:
            reply = await self.request("add", add)
            unresolved = set(reply.unresolved) if reply is not None else set(add)
            self.sent.update(c for c in add if c not in unresolved)
            if unresolved and reply is not None:
                self._failed("add", "unresolved", f"no pid namespace yet for {', '.join(sorted(unresolved))}")
            ok = not unresolved
        if delete:
            done = await self.request("delete", delete) is not None
            if done:
                self.sent.difference_update(delete)
            ok = ok and done
        return ok

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

    async def hits(self, containers: tuple[str, ...]) -> dict[str, int] | None:
        """GPU ioctl hits by the pod key the bridge gives (``ns/pod`` or ``ns/pod/container``).

        None when the bridge did not answer.
        """
        if not containers:
            return {}
        reply = await self.request("stats", containers)
        if reply is None:
            return None
        found: dict[str, int] = {}
        for stat in reply.stats:
            if stat.pod:
                found[stat.pod] = found.get(stat.pod, 0) + stat.hits
        return found

    def status(self) -> dict[str, object]:
        return {"containers": sorted(self.sent), "pending": len(self.wanted ^ self.sent),
                "last_error": self.last_error}

