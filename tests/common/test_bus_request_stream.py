"""Request/reply on a subject the GPUSHARE stream also captures (e.g. ``kmod.cmd``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from gpushare_common import events
from gpushare_common.bus import Bus, BusError
from gpushare_common.settings import NatsSettings


@pytest.fixture
async def bus(nats_settings: NatsSettings) -> AsyncIterator[Bus]:
    bus = Bus(nats_settings, "test")
    await bus.connect()
    await bus.ensure_stream()
    yield bus
    await bus.drain()


async def test_request_skips_the_stream_ack(bus: Bus) -> None:
    subject = bus.subjects.kmod_cmd("n1")

    async def responder(event: events.AnyEvent) -> events.Event:
        return events.KmodReply(node="n1", op="stats", status=0)

    await bus.serve(subject, responder)
    reply = await bus.request(subject, events.KmodCommand(node="n1", op="stats"), timeout=2)
    assert isinstance(reply, events.KmodReply) and reply.op == "stats"


async def test_request_without_a_responder_times_out_despite_the_ack(bus: Bus) -> None:
    with pytest.raises(BusError, match="no reply"):
        await bus.request(bus.subjects.kmod_cmd("n2"), events.KmodCommand(node="n2", op="stats"), timeout=0.3)
