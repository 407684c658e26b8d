"""The auth callout's lifecycle: connect as the ``auth`` user, answer ``$SYS.REQ.USER.AUTH`` in a
queue group (replicas share the requests), serve HTTP, drain.

- Consumes: ``$SYS.REQ.USER.AUTH`` (core, queue group); TokenReviews (API server).
- Publishes: the signed answers, to each request's reply subject.
- Runs: ``workers`` answerers of the requests that need a TokenReview (at most ``queue_size``
  wait; the excess is refused at once); HTTP. Every other request is answered as it arrives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from gpushare_common.adapters.kube import Kube
from gpushare_common.bus import Bus, BusError
from gpushare_common.layout import Layout
from gpushare_common.logging import get_logger
from gpushare_common.service import ServiceBase

from .adapters.tokenreview import TokenReviewer
from .callout import Callout, CalloutMetrics, Ticket
from .handlers import AUTH_SUBJECT
from .nkey import Signer
from .settings import Settings
from .status import NatsAuthStatus

SERVICE = "nats-auth"
log = get_logger(SERVICE)
Pending = asyncio.Queue[tuple[Ticket, str]]


async def publish_answer(bus: Bus, reply: str, answer: bytes) -> None:
    try:
        await bus.publish_bytes(reply, answer)
    except BusError as err:
        log.warning("could not answer an authorization request", error=str(err))


async def answer_requests(pending: Pending, callout: Callout, bus: Bus) -> None:
    """One worker: review the queued tickets' tokens and answer, until cancelled."""
    while True:
        ticket, reply = await pending.get()
        await publish_answer(bus, reply, await callout.review(ticket))


class Service(ServiceBase):
    """The callout: ``issuer`` signs every answer."""

    status_model = NatsAuthStatus

    def __init__(self, settings: Settings, issuer: Signer, stop: asyncio.Event | None = None) -> None:
        super().__init__(SERVICE, settings.common.http, "nats", "callout", stop=stop)
        auth, nats = settings.auth, settings.common.nats
        self.auth, self.issuer = auth, issuer
        self.metrics = CalloutMetrics(self.registry)
        reviewer = TokenReviewer(Kube(settings.common.kube), auth.audience)
        self.skeleton.on_exit(reviewer.close)
        self.callout = Callout(issuer, reviewer, auth.role_table(),
                               Layout(nats.prefix, nats.stream, nats.kv_prefix), auth, self.metrics)
        self.pending: Pending = asyncio.Queue(maxsize=auth.queue_size)
        self.bus = self.skeleton.bus(nats)

    async def _enqueue(self, raw: bytes, reply: str) -> None:
        """Answer now what needs no review; queue the rest, refusing what does not fit."""
        if not reply:
            return
        found = self.callout.triage(raw)
        await asyncio.sleep(0)  # a backlog of requests must not starve the reviews in flight
        if isinstance(found, bytes):
            await publish_answer(self.bus, reply, found)
            return
        try:
            self.pending.put_nowait((found, reply))
        except asyncio.QueueFull:
            await publish_answer(self.bus, reply, self.callout.overloaded(found))

    async def start(self) -> None:
        svc, auth = self.skeleton, self.auth
        await self.bus.connect(svc.stop)
        for index in range(auth.workers):
            svc.spawn(f"answer-{index}", answer_requests(self.pending, self.callout, self.bus))
        subscription = await self.bus.subscribe_raw(AUTH_SUBJECT, self._enqueue, queue=auth.queue)
        svc.on_exit(subscription.unsubscribe)
        self.health.set("callout", True)
        log.info("answering authorization requests", issuer=self.issuer.public, audience=auth.audience,
                 queue=auth.queue, workers=auth.workers)  # fmt: skip

    def status(self) -> Mapping[str, Any]:
        return {"issuer": self.issuer.public, "audience": self.auth.audience, "pending": self.pending.qsize(),
                "verdicts_kept": len(self.callout.verdicts), **self.metrics.status()}  # fmt: skip
