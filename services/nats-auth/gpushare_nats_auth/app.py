"""The auth callout's lifecycle: connect as the ``auth`` user, answer ``$SYS.REQ.USER.AUTH`` in a
queue group (replicas share the requests), serve HTTP, drain.

- Consumes: ``$SYS.REQ.USER.AUTH`` (core, queue group); TokenReviews (API server).
- Publishes: the signed answers, to each request's reply subject.
- Runs: ``workers`` answerers; HTTP.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gpushare_common.adapters.kube import Kube
from gpushare_common.bus import Bus, BusError
from gpushare_common.layout import Layout
from gpushare_common.logging import get_logger
from gpushare_common.service import Skeleton

from .adapters.tokenreview import TokenReviewer
from .callout import Callout, CalloutMetrics
from .handlers import AUTH_SUBJECT
from .nkey import Signer
from .settings import Settings

SERVICE = "nats-auth"
log = get_logger(SERVICE)
Pending = asyncio.Queue[tuple[bytes, str]]


async def answer_requests(pending: Pending, callout: Callout, bus: Bus) -> None:
    """One worker: answer queued requests until cancelled."""
    while True:
        raw, reply = await pending.get()
        answer = await callout.answer(raw)
        try:
            await bus.publish_bytes(reply, answer)
        except BusError as err:
            log.warning("could not answer an authorization request", error=str(err))


async def run(settings: Settings, issuer: Signer, stop: asyncio.Event) -> int:
    auth, nats = settings.auth, settings.common.nats
    async with Skeleton(SERVICE, settings.common.http, "nats", "callout", stop=stop) as svc:
        metrics = CalloutMetrics(svc.registry)
        reviewer = TokenReviewer(Kube(settings.common.kube), auth.audience)
        svc.on_exit(reviewer.close)
        callout = Callout(issuer, reviewer, auth.role_table(), Layout(nats.prefix, nats.stream, nats.kv_prefix),
                          auth, metrics)  # fmt: skip
        pending: Pending = asyncio.Queue()

        async def enqueue(raw: bytes, reply: str) -> None:
            if reply:
                pending.put_nowait((raw, reply))

        def status() -> dict[str, Any]:
            return {"issuer": issuer.public, "audience": auth.audience, "pending": pending.qsize(),
                    **metrics.status()}  # fmt: skip

        bus = await svc.connect(nats, stream=False)
        await svc.serve(status)
        for index in range(auth.workers):
            svc.spawn(f"answer-{index}", answer_requests(pending, callout, bus))
        subscription = await bus.subscribe_raw(AUTH_SUBJECT, enqueue, queue=auth.queue)
        svc.on_exit(subscription.unsubscribe)
        svc.health.set("callout", True)
        log.info("answering authorization requests", issuer=issuer.public, audience=auth.audience,
                 queue=auth.queue, workers=auth.workers)  # fmt: skip
        await svc.run_until_stopped()
    return svc.exit_code
