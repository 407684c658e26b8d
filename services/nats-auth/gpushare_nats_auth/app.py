"""The auth callout's lifecycle: connect as the ``auth`` user, answer ``$SYS.REQ.USER.AUTH`` in a
queue group (replicas share the requests), serve HTTP, drain."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from gpushare_common.adapters.kube import Kube
from gpushare_common.bus import Bus, BusError
from gpushare_common.http import Health, build_app, serve
from gpushare_common.layout import Layout
from gpushare_common.logging import get_logger
from gpushare_common.tasks import Tasks, wait_first
from prometheus_client import CollectorRegistry

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
    registry = CollectorRegistry()
    metrics = CalloutMetrics(registry)
    health = Health("nats", "callout")
    tasks = Tasks(SERVICE)
    reviewer = TokenReviewer(Kube(settings.common.kube), auth.audience)
    callout = Callout(issuer, reviewer, auth.role_table(), Layout(nats.prefix, nats.stream, nats.kv_prefix), auth,
                      metrics)  # fmt: skip
    pending: Pending = asyncio.Queue()

    async def enqueue(raw: bytes, reply: str) -> None:
        if reply:
            pending.put_nowait((raw, reply))

    def status() -> dict[str, Any]:
        return {"issuer": issuer.public, "audience": auth.audience, "pending": pending.qsize(), **metrics.status()}

    async with contextlib.AsyncExitStack() as stack:
        stack.callback(reviewer.close)
        bus = Bus(nats, SERVICE, registry)
        bus.on_state.append(lambda up: health.set("nats", up, "" if up else "disconnected"))
        await bus.connect(stop)
        stack.push_async_callback(bus.drain)
        await stack.enter_async_context(serve(build_app(SERVICE, health, registry, status), settings.common.http))
        for index in range(auth.workers):
            tasks.spawn(f"answer-{index}", answer_requests(pending, callout, bus))
        subscription = await bus.subscribe_raw(AUTH_SUBJECT, enqueue, queue=auth.queue)
        stack.push_async_callback(subscription.unsubscribe)
        health.set("callout", True)
        log.info("answering authorization requests", issuer=issuer.public, audience=auth.audience,
                 queue=auth.queue, workers=auth.workers)  # fmt: skip
        await wait_first(stop, tasks)
        await tasks.cancel_all()
    return 1 if tasks.failure is not None else 0
