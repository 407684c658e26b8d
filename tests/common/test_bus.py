"""The typed bus against a real nats-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from gpushare_common import events
from gpushare_common.bus import AckPolicy, Bus, BusError, Retryable
from gpushare_common.settings import NatsSettings
from prometheus_client import CollectorRegistry

from tests.support.nats import NatsServer


@pytest.fixture
async def bus(nats_settings: NatsSettings) -> AsyncIterator[Bus]:
    bus = Bus(nats_settings, "test", CollectorRegistry())
    await bus.connect()
    yield bus
    await bus.drain()


def metric(bus: Bus, outcome: str) -> float:
    return bus.metrics.messages.labels(outcome)._value.get()  # type: ignore[no-any-return]


async def wait_for(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_typed_publish_subscribe_skips_undecodable(bus: Bus) -> None:
    subject = bus.subjects.event("n1", "spot")
    got: list[events.AnyEvent] = []

    async def handler(event: events.AnyEvent) -> None:
        got.append(event)

    await bus.subscribe(subject, handler)
    await bus.nc.publish(subject, b"not json at all")
    sent = events.SpotEvent(node="n1", pod="b/x", container="c", state="using")
    await bus.publish(subject, sent)
    await wait_for(lambda: got)
    assert got == [sent]
    assert metric(bus, "undecodable") == 1


async def test_request_reply(bus: Bus) -> None:
    subject = bus.subjects.kmod_cmd("n1")

    async def responder(event: events.AnyEvent) -> events.Event:
        assert isinstance(event, events.KmodCommand)
        return events.KmodReply(node="n1", op=event.op, status=0, pidns=event.pidns)

    await bus.serve(subject, responder)
    reply = await bus.request(subject, events.KmodCommand(node="n1", op="detect", pidns=(7,)))
    assert isinstance(reply, events.KmodReply) and reply.pidns == (7,)
    with pytest.raises(BusError, match="no reply"):
        await bus.request(bus.subjects.kmod_cmd("other"), events.KmodCommand(node="o", op="stats"),
                          timeout=0.2)


async def test_durable_consumer_ack_policy(bus: Bus) -> None:
    await bus.ensure_stream()
    subject = bus.subjects.event("n1", "share")
    attempts: dict[str, int] = {}
    done = asyncio.Event()

    async def handler(event: events.AnyEvent) -> None:
        attempts[event.id] = attempts.get(event.id, 0) + 1
        if isinstance(event, events.ShareEvent) and event.share_pod == "ml/flaky":
            raise Retryable("not yet")
        if isinstance(event, events.ShareEvent) and event.share_pod == "ml/broken":
            raise KeyError("bug")
        if isinstance(event, events.ShareEvent) and event.share_pod == "ml/last":
            done.set()

    flaky = events.ShareEvent(node="n1", share_pod="ml/flaky", container="c", resource="r", state="using")
    broken = events.ShareEvent(node="n1", share_pod="ml/broken", container="c", resource="r", state="using")
    last = events.ShareEvent(node="n1", share_pod="ml/last", container="c", resource="r", state="using")
    for event in (flaky, broken, last):
        await bus.publish_persistent(subject, event)
    await bus.nc.publish(subject, b"{garbage")
    await bus.nc.flush()
    stop = asyncio.Event()
    policy = AckPolicy(max_deliver=3, retry_delay_s=0.05)
    consume = bus.consume(bus.subjects.node_events("n1"), "solver-n1", handler, policy, stop)
    task = asyncio.create_task(consume)
    await asyncio.wait_for(done.wait(), 10)
    await wait_for(lambda: attempts.get(flaky.id) == 3 and metric(bus, "dropped") == 2)
    stop.set()
    await task
    assert attempts[broken.id] == 1
    assert metric(bus, "undecodable") == 1


async def test_publish_persistent_deduplicates_by_event_id(bus: Bus) -> None:
    await bus.ensure_stream()
    event = events.LowPowerEvent(node="n1", owner="dev/m", using=True)
    first = await bus.publish_persistent(bus.subjects.event("n1", "lowpower"), event)
    second = await bus.publish_persistent(bus.subjects.event("n1", "lowpower"), event)
    assert first == second


async def test_consumer_survives_server_restart_without_loss(subject_prefix: str) -> None:
    server = NatsServer().start()
    try:
        settings = NatsSettings(url=server.url, prefix=f"{subject_prefix}.v1", stream="RESTART",
                                reconnect_wait_s=0.05, connect_timeout_s=0.5)
        bus = Bus(settings, "test", CollectorRegistry())
        await bus.connect()
        await bus.ensure_stream()
        subject = bus.subjects.event("n1", "spot")
        seen: set[str] = set()
        sent: list[str] = []

        async def handler(event: events.AnyEvent) -> None:
            seen.add(event.id)

        stop = asyncio.Event()
        task = asyncio.create_task(bus.consume(subject, "durable", handler, AckPolicy(), stop))
        for i in range(50):
            event = events.SpotEvent(node="n1", pod=f"b/p{i}", container="c", state="using")
            sent.append(event.id)
            await bus.publish_persistent(subject, event)
        await wait_for(lambda: len(seen) == 50, 10)
        await asyncio.to_thread(server.restart)
        await asyncio.wait_for(bus.connected.wait(), 15)
        for i in range(50, 100):
            event = events.SpotEvent(node="n1", pod=f"b/p{i}", container="c", state="using")
            for _ in range(100):
                try:
                    await bus.publish_persistent(subject, event)
                    break
                except Exception:
                    await asyncio.sleep(0.05)
            sent.append(event.id)
        await wait_for(lambda: set(sent) <= seen, 20)
        stop.set()
        await task
        await bus.drain()
    finally:
        server.cleanup()
