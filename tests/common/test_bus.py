"""The typed bus against a real nats-server: pub/sub, request/reply, the durable consumer's
ack policy (nothing is terminated for a failure that is not the message's), typed errors."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from gpushare_common import events
from gpushare_common.bus import AckPolicy, Bus, BusError, Permanent, Transient
from gpushare_common.retry import Backoff
from gpushare_common.settings import NatsSettings
from prometheus_client import CollectorRegistry

from tests.support.nats import NatsServer


@pytest.fixture
async def bus(nats_settings: NatsSettings) -> AsyncIterator[Bus]:
    bus = Bus(nats_settings, "test", CollectorRegistry())
    await bus.connect()
    await bus.wait_for_stream()
    yield bus
    await bus.drain()


def metric(bus: Bus, outcome: str) -> float:
    return bus.metrics.messages.labels(outcome)._value.get()  # type: ignore[no-any-return]


def terminated(bus: Bus, reason: str) -> float:
    return bus.metrics.terminated.labels(reason)._value.get()  # type: ignore[no-any-return]


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
    await bus.publish_bytes(subject, b"not json at all")
    sent = events.SpotEvent(node="n1", pod="b/x", container="c", state="using")
    await bus.publish(subject, sent)
    await wait_for(lambda: got)
    assert got == [sent]
    assert metric(bus, "undecodable") == 1


async def test_request_reply_and_a_missing_responder_is_transient(bus: Bus) -> None:
    subject = bus.subjects.kmod_cmd("n1", "detect")

    async def responder(event: events.AnyEvent) -> events.Event:
        assert isinstance(event, events.KmodCommand)
        return events.KmodReply(node="n1", op=event.op, status=0, pidns=event.pidns)

    await bus.serve(subject, responder)
    reply = await bus.request(subject, events.KmodCommand(node="n1", op="detect", pidns=(7,)))
    assert isinstance(reply, events.KmodReply) and reply.pidns == (7,)
    with pytest.raises(Transient, match="is the serving service running"):
        await bus.request(bus.subjects.kmod_cmd("other", "stats"), events.KmodCommand(node="o", op="stats"),
                          timeout=0.2)


class Invalid(ValueError):
    """The test's stand-in for an event that contradicts the state."""


async def test_only_invalid_messages_are_terminated(bus: Bus) -> None:
    """A transient failure, and any other failure that is not the message's fault, is retried
    past five deliveries until it passes; only ``invalid`` and undecodable messages end."""
    subject = bus.subjects.event("n1", "share")
    attempts: dict[str, int] = {}

    def share(pod: str) -> events.ShareEvent:
        return events.ShareEvent(node="n1", share_pod=pod, container="c", resource="r", state="using")

    flaky, buggy, invalid, last = share("ml/flaky"), share("ml/buggy"), share("ml/invalid"), share("ml/last")

    async def handler(event: events.AnyEvent) -> None:
        attempts[event.id] = attempts.get(event.id, 0) + 1
        if event.id == flaky.id and attempts[event.id] < 7:
            raise Transient("put", "timeout")
        if event.id == buggy.id and attempts[event.id] < 3:
            raise Permanent("put", "permission denied")  # the bus, not the message: retried
        if event.id == invalid.id:
            raise Invalid("contradicts the state")

    for event in (flaky, buggy, invalid, last):
        await bus.publish_persistent(subject, event)
    await bus.publish_bytes(subject, b"{garbage")
    stop = asyncio.Event()
    policy = AckPolicy(invalid=(Invalid,), backoff=Backoff(0.01, 0.05))
    task = asyncio.create_task(bus.consume(bus.subjects.node_events("n1"), "solver-n1", handler, policy, stop))
    await wait_for(lambda: attempts.get(flaky.id) == 7 and attempts.get(buggy.id) == 3
                   and attempts.get(last.id) == 1, 20)  # fmt: skip
    await wait_for(lambda: metric(bus, "handled") == 3)
    stop.set()
    await task
    assert attempts[invalid.id] == 1
    assert (terminated(bus, "Invalid"), terminated(bus, "undecodable")) == (1, 1)


def bug_records(caplog: pytest.LogCaptureFixture, kind: type[BaseException]) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.ERROR and r.exc_info and r.exc_info[0] is kind]


async def test_a_bug_in_a_bus_call_is_not_a_bus_error(bus: Bus) -> None:
    """A wrong argument is a TypeError with its traceback, not a Permanent a caller moves past."""
    subject = bus.subjects.event("n1", "spot")
    with pytest.raises(TypeError):
        await bus.publish_bytes(subject, "text, not bytes")  # type: ignore[arg-type]
    store = await bus.store("solver", "n1.mapping")
    with pytest.raises(TypeError):
        await store.put("k", object())
    with pytest.raises(BusError):  # what NATS refuses still is one
        await bus.publish_bytes("bad subject with spaces", b"x")


async def test_a_handler_bug_is_logged_counted_and_its_message_kept(bus: Bus,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    subject = bus.subjects.event("n1", "share")
    sent = events.ShareEvent(node="n1", share_pod="ml/p", container="c", resource="r", state="using")
    attempts: list[str] = []

    async def handler(event: events.AnyEvent) -> None:
        attempts.append(event.id)
        if len(attempts) < 3:
            raise TypeError("'NoneType' object is not subscriptable")  # the bug, until it is fixed

    await bus.publish_persistent(subject, sent)
    stop = asyncio.Event()
    policy = AckPolicy(invalid=(Invalid,), backoff=Backoff(0.01, 0.05))
    task = asyncio.create_task(bus.consume(bus.subjects.node_events("n1"), "solver-n1", handler, policy, stop))
    await wait_for(lambda: metric(bus, "handled") == 1, 10)
    stop.set()
    await task
    assert attempts == [sent.id] * 3 and metric(bus, "bug") == 2 and metric(bus, "retried") == 0
    assert not any(bus.metrics.terminated.collect()[0].samples)
    assert len(bug_records(caplog, TypeError)) == 2


async def test_a_core_handler_bug_is_told_apart_from_a_failure(bus: Bus, caplog: pytest.LogCaptureFixture) -> None:
    subject = bus.subjects.event("n1", "spot")
    seen: list[str] = []

    async def handler(event: events.AnyEvent) -> None:
        seen.append(event.id)
        if len(seen) == 1:
            raise KeyError("ml/p")
        raise Transient("put", "timeout")

    await bus.subscribe(subject, handler)
    for pod in ("b/x", "b/y"):
        await bus.publish(subject, events.SpotEvent(node="n1", pod=pod, container="c", state="using"))
    await wait_for(lambda: metric(bus, "dropped") == 1)
    assert metric(bus, "bug") == 1 and len(bug_records(caplog, KeyError)) == 1
    assert not bug_records(caplog, Transient)


async def test_publish_persistent_deduplicates_by_event_id(bus: Bus) -> None:
    event = events.LowPowerEvent(node="n1", owner="dev/m", using=True)
    first = await bus.publish_persistent(bus.subjects.event("n1", "lowpower"), event)
    second = await bus.publish_persistent(bus.subjects.event("n1", "lowpower"), event)
    assert first == second


async def test_publishing_without_a_stream_is_transient(nats_settings: NatsSettings) -> None:
    bus = Bus(nats_settings, "test")
    await bus.connect()
    try:
        with pytest.raises(Transient):
            await bus.publish_persistent(bus.subjects.event("n1", "spot"),
                                         events.SpotEvent(node="n1", pod="a/b", container="c", state="using"))
        store = await bus.store("solver", "n1.mapping")  # bound without asking: the first use tells
        with pytest.raises(Transient, match="installer"):
            await store.get("k", dict)
    finally:
        await bus.drain()


async def test_stream_window_reads_in_order_after_a_cursor(bus: Bus) -> None:
    records = [events.EvictionRecord(node="n1", pod=f"a/p{i}", reason="owner-back") for i in range(3)]
    start = await bus.last_seq()
    for record in records:
        await bus.publish_persistent(bus.subjects.eviction("n1"), record)
        await bus.publish_persistent(bus.subjects.event("n1", "spot"),
                                     events.SpotEvent(node="n1", pod="x/y", container="c", state="using"))
    found = await bus.read_after(f"{bus.subjects.prefix}.*.eviction", start)
    assert [m.event() for m in found] == records
    assert await bus.read_after(f"{bus.subjects.prefix}.*.eviction", found[-1].seq) == []
    assert all(m.time > 0 for m in found)


async def test_publish_reliably_waits_out_a_server_restart(subject_prefix: str) -> None:
    server = NatsServer().start()
    try:
        settings = NatsSettings(url=server.url, prefix=f"{subject_prefix}.v1", stream="RESTART",
                                reconnect_wait_s=0.05, connect_timeout_s=0.5, ensure_layout=True)
        bus = Bus(settings, "test", CollectorRegistry())
        await bus.connect()
        await bus.wait_for_stream()
        server.stop()
        event = events.OwnerBackEvent(node="n1", pidns=4026531999, pid=7, kernel_ts_ns=1)
        publishing = asyncio.create_task(bus.publish_reliably(bus.subjects.event("n1", "ownerback"), event))
        await asyncio.sleep(0.3)
        assert not publishing.done()
        await asyncio.to_thread(server.start)
        seq = await asyncio.wait_for(publishing, 20)
        found = await bus.read_after(bus.subjects.event("n1", "ownerback"), seq - 1)
        assert [m.event() for m in found] == [event]
        await bus.drain()
    finally:
        server.cleanup()


async def test_consumer_survives_server_restart_without_loss(subject_prefix: str) -> None:
    server = NatsServer().start()
    try:
        settings = NatsSettings(url=server.url, prefix=f"{subject_prefix}.v1", stream="RESTART",
                                reconnect_wait_s=0.05, connect_timeout_s=0.5, ensure_layout=True)
        bus = Bus(settings, "test", CollectorRegistry())
        await bus.connect()
        await bus.wait_for_stream()
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
        for i in range(50, 100):
            event = events.SpotEvent(node="n1", pod=f"b/p{i}", container="c", state="using")
            await bus.publish_reliably(subject, event, deadline_s=20)
            sent.append(event.id)
        await wait_for(lambda: set(sent) <= seen, 20)
        stop.set()
        await task
        await bus.drain()
    finally:
        server.cleanup()


def test_bus_errors_are_one_tree() -> None:
    assert issubclass(Transient, BusError) and issubclass(Permanent, BusError)
    assert not issubclass(Transient, Permanent)
