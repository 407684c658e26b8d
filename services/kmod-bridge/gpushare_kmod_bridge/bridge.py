"""The bridge between NATS and the kernel: commands in, owner-back events out.

- ``serve_command``: a :class:`KmodCommand` (pid-namespace ids and/or pod
  keys, resolved here) updates the watch set, goes to the kernel, and the
  kernel's status comes back as a :class:`KmodReply`. When the kernel is not
  registered the watch set still changes (it is re-sent on registration) and
  the reply says ``-ENOTCONN``.
- ``on_notice``: each kernel notice becomes one :class:`OwnerBackEvent` on
  ``<prefix>.<node>.event.ownerback``, resolved to its pod when possible.
- ``on_registered``: re-sends the watch set (ADD, then DETECT) and the ioctl
  filter when one is configured.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from gpushare_common import events
from gpushare_common.logging import get_logger

from . import handlers, protocol
from .link import KernelLink, KernelUnavailable
from .metrics import BridgeMetrics
from .resolver import ResolveError, Resolver, split_key
from .watchset import Mode, WatchSet

log = get_logger("kmod-bridge")

Publish = Callable[[str, events.Event], Awaitable[None]]


class Bridge:
    def __init__(self, node: str, subject: str, publish: Publish, watchset: WatchSet,
                 resolver: Resolver, metrics: BridgeMetrics,
                 filter_config: protocol.FilterConfig | None = None) -> None:
        self.node = node
        self.subject = subject
        self.publish = publish
        self.watchset = watchset
        self.resolver = resolver
        self.metrics = metrics
        self.filter_config = filter_config
        self.link: KernelLink | None = None
        self.last_notice: dict[str, Any] = {}

    def attach(self, link: KernelLink) -> None:
        self.link = link

    # --- kernel -> NATS -------------------------------------------------------------

    async def on_notice(self, notice: protocol.Notice, received_ns: int) -> None:
        entry = self.watchset.get(notice.pidns)
        owner = None if entry is not None and entry.pod else await self.resolver.owner(notice.pidns)
        pod, container = handlers.owner_of(entry, owner)
        event = handlers.owner_back(self.node, notice, pod, container, time.monotonic_ns())
        await self.publish(self.subject, event)
        self.metrics.published.labels(str(event.resolved).lower()).inc()
        self.metrics.latency.observe(event.notice_to_publish_ms / 1000)
        if entry is not None and entry.mode == "detected":
            await self.watchset.undetect([notice.pidns])  # the kernel cleared need_notice
            self._count_watched()
        self.last_notice = {"pidns": notice.pidns, "pid": notice.pid, "pod": pod,
                            "id": event.id, "latency_ms": round(event.notice_to_publish_ms, 3)}
        log.info("owner back", node=self.node, pod=pod or None, pidns=notice.pidns, pid=notice.pid,
                 resolved=event.resolved, latency_ms=round(event.notice_to_publish_ms, 3))

    async def on_registered(self) -> None:
        link = self._link()
        if self.filter_config is not None:
            await link.request(protocol.CMD_CONFIG, config=self.filter_config)
        modes: tuple[tuple[Mode, int], ...] = (("watched", protocol.CMD_ADD),
                                               ("detected", protocol.CMD_DETECT))
        for mode, cmd in modes:
            for chunk in handlers.chunks(self.watchset.by_mode(mode)):
                if chunk:
                    await link.request(cmd, chunk)
        log.info("watch set sent to the kernel", node=self.node, **self.watchset.counts())

    # --- NATS -> kernel -------------------------------------------------------------

    async def serve_command(self, request: events.AnyEvent) -> events.Event:
        if not isinstance(request, events.KmodCommand):
            got = events.event_tag(request)
            return self._reply("?", handlers.EINVAL, (), f"expected kmod_cmd, got {got}")
        op = request.op
        if op not in handlers.KERNEL_OPS:
            return self._reply(op, handlers.EINVAL, (), f"op {op!r} is not served (config is a setting)")
        try:
            ids, owners = await self._resolve(request)
        except (ResolveError, protocol.ProtocolError) as err:
            return self._reply(op, handlers.EINVAL, request.pidns, str(err))
        if request.pods and not ids:
            return self._reply(op, handlers.ENOENT, (), f"no pid namespace found for {list(request.pods)}")
        await self._remember(op, ids, owners)
        return await self._to_kernel(op, ids)

    async def _resolve(self, request: events.KmodCommand) -> tuple[list[int], dict[int, tuple[str, str]]]:
        protocol.check_ids(request.pidns)
        owners: dict[int, tuple[str, str]] = {}
        for key, found in (await self.resolver.namespaces(request.pods)).items():
            for pidns in found:
                owner = self.resolver.snapshot.owners.get(pidns)
                owners[pidns] = (owner.pod, owner.container) if owner else split_key(key)
        ids = list(dict.fromkeys([*request.pidns, *owners]))
        protocol.check_ids(ids)
        return ids, owners

    async def _remember(self, op: str, ids: Sequence[int], owners: dict[int, tuple[str, str]]) -> None:
        if op == "add":
            fresh = [p for p in ids if self.watchset.get(p) is None]
            await self.watchset.set_mode(fresh, "watched", owners)
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
        return handlers.reply_event(self.node, op, status, ids, "", replies, self.pod_of)

    def _reply(self, op: str, status: int, ids: Sequence[int], message: str) -> events.KmodReply:
        if status < 0:
            log.warning("kmod command refused", node=self.node, op=op, status=status, reason=message)
        return handlers.reply_event(self.node, op, status, ids, message)

    # --- views ---------------------------------------------------------------------

    def pod_of(self, pidns: int) -> str:
        entry = self.watchset.get(pidns)
        owner = self.resolver.snapshot.owners.get(pidns)
        return handlers.owner_of(entry, owner)[0]

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
            "watch_set": [
                {"pidns": e.pidns, "mode": e.mode, "pod": e.pod, "container": e.container}
                for e in sorted(self.watchset.entries.values(), key=lambda e: e.pidns)
            ],
            "last_notice": self.last_notice,
            **handlers.stats_view(link.last_stats if link else None, self.pod_of),
        }
