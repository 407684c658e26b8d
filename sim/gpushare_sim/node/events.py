"""core/v1 Events, as a kubelet (or a scheduler) records them through client-go's
event recorder: one Event per (object, reason, message, type, source), and a
repeat of the same one bumps its `count` and `lastTimestamp` instead of making
another object.

`record()` never waits: events go into a bounded queue that one task sends in
order; when the API is slow the oldest waiting events are dropped (and counted)
rather than holding up a pod's lifecycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Protocol

from gpushare_sim.node.adapters.kube import KubeError, NotFound
from gpushare_sim.node.model import PodDef
from gpushare_sim.node.status import now_rfc3339

log = logging.getLogger("gpushare_sim.node.events")

NORMAL, WARNING = "Normal", "Warning"
_REMEMBERED = 4096  # events whose repeats are coalesced


class EventSink(Protocol):
    async def create_event(self, namespace: str, body: dict[str, Any]) -> None: ...
    async def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class Involved:
    """The object an event is about (its `involvedObject`)."""

    kind: str
    namespace: str
    name: str
    uid: str = ""
    field_path: str = ""

    @classmethod
    def pod(cls, pod: PodDef, container: str = "") -> Involved:
        return cls("Pod", pod.namespace, pod.name, pod.uid, f"spec.containers{{{container}}}" if container else "")

    def reference(self) -> dict[str, str]:
        ref = {"kind": self.kind, "namespace": self.namespace, "name": self.name, "apiVersion": "v1"}
        if self.uid:
            ref["uid"] = self.uid
        if self.field_path:
            ref["fieldPath"] = self.field_path
        return ref


@dataclass(frozen=True, slots=True)
class _Pending:
    involved: Involved
    type: str
    reason: str
    message: str
    at: float


@dataclass(slots=True)
class _Seen:
    name: str
    count: int


class EventRecorder:
    """Records events for one source (`kubelet` on a host, `default-scheduler`)."""

    def __init__(self, sink: EventSink | None, component: str, host: str = "", capacity: int = 1000) -> None:
        self.sink, self.component, self.host = sink, component, host
        self.queue: deque[_Pending] = deque()
        self.capacity = capacity
        self.wake = asyncio.Event()
        self.idle = asyncio.Event()  # set while nothing waits to be sent
        self.idle.set()
        self.seen: OrderedDict[tuple[Any, ...], _Seen] = OrderedDict()
        self.sent = self.dropped = self.failed = 0
        self._task: asyncio.Task[None] | None = None

    def record(self, involved: Involved, type_: str, reason: str, message: str) -> None:
        if self.sink is None:
            return
        if len(self.queue) >= self.capacity:
            self.queue.popleft()
            self.dropped += 1
        self.queue.append(_Pending(involved, type_, reason, message, time.time()))
        self.idle.clear()
        self.wake.set()

    def start(self) -> None:
        if self.sink is not None and self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"events-{self.component}")
            self._task.add_done_callback(_log_crash)

    async def flush(self, timeout: float = 5.0) -> None:
        """Wait (up to `timeout`) until everything recorded so far has been sent."""
        if self._task is None or self._task.done():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.idle.wait()

    async def close(self) -> None:
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.queue:
                await self._send(self.queue.popleft())
            self.idle.set()

    async def _send(self, event: _Pending) -> None:
        assert self.sink is not None
        key = (event.involved, event.type, event.reason, event.message)
        seen = self.seen.get(key)
        stamp = now_rfc3339(event.at)
        try:
            if seen is not None:
                seen.count += 1
                try:
                    await self.sink.patch_event(event.involved.namespace, seen.name,
                                                {"count": seen.count, "lastTimestamp": stamp})  # fmt: skip
                    self.seen.move_to_end(key)
                    self.sent += 1
                    return
                except NotFound:
                    self.seen.pop(key, None)
            await self._create(key, event, stamp)
        except KubeError as err:
            self.failed += 1
            log.warning("event not recorded reason=%s object=%s/%s: %s", event.reason,
                        event.involved.namespace, event.involved.name, err)  # fmt: skip

    async def _create(self, key: tuple[Any, ...], event: _Pending, stamp: str) -> None:
        assert self.sink is not None
        name = f"{event.involved.name}.{time.time_ns():x}"
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": event.involved.namespace},
            "involvedObject": event.involved.reference(),
            "reason": event.reason, "message": event.message, "type": event.type,
            "source": {"component": self.component, **({"host": self.host} if self.host else {})},
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
            "reportingComponent": self.component, "reportingInstance": self.host,
        }  # fmt: skip
        await self.sink.create_event(event.involved.namespace, body)
        self.seen[key] = _Seen(name, 1)
        if len(self.seen) > _REMEMBERED:
            self.seen.popitem(last=False)
        self.sent += 1

    def status(self) -> dict[str, int]:
        return {"sent": self.sent, "queued": len(self.queue), "dropped": self.dropped, "failed": self.failed}


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("task crashed name=%s", task.get_name(), exc_info=task.exception())
