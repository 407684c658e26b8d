"""A bucket seen through one node's scope, and the typed errors of the bus, on a real server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import nats.errors
import nats.js.errors
import pytest
from gpushare_common import events
from gpushare_common.bus import Bus, NotFound, Permanent, Transient, escape_key, unescape_key
from gpushare_common.bus.errors import classify
from gpushare_common.settings import NatsSettings
from hypothesis import given
from hypothesis import strategies as st


@pytest.fixture
async def bus(nats_settings: NatsSettings) -> AsyncIterator[Bus]:
    bus = Bus(nats_settings, "test")
    await bus.connect()
    await bus.wait_for_stream()
    yield bus
    await bus.drain()


class Doc(msgspec.Struct):
    owner: str
    count: int = 0


async def test_a_scope_sees_only_its_own_keys(bus: Bus) -> None:
    a = await bus.store("solver", bus.layout.scope("node-a", "mapping"))
    b = await bus.store("solver", bus.layout.scope("node-b", "mapping"))
    await a.put("ns/pod.with.dots", Doc("ns/pod.with.dots", 1))
    await a.put("idle-space", Doc("idle-space"))
    await b.put("ns/other", Doc("ns/other"))
    assert await a.keys() == ["idle-space", "ns/pod.with.dots"]
    assert await a.get("ns/pod.with.dots", Doc) == Doc("ns/pod.with.dots", 1)
    assert await b.items(Doc) == {"ns/other": Doc("ns/other")}
    await a.delete("idle-space")
    await a.delete("idle-space")  # twice: no error
    assert await a.keys() == ["ns/pod.with.dots"]
    assert await a.get("idle-space", Doc) is None


async def test_a_value_that_does_not_decode_is_permanent_and_named(bus: Bus) -> None:
    store = await bus.store("health", bus.layout.scope("n1", "health"))
    await store.put("spot-gpu", {"resource": 7})
    await store.put("vcpu", Doc("x"))
    with pytest.raises(Permanent, match="spot-gpu"):
        await store.get("spot-gpu", events.DeviceHealth)
    good, bad = await store.items_lenient(Doc)
    assert list(good) == ["vcpu"] and list(bad) == ["spot-gpu"]


async def test_requests_are_not_recorded_by_the_stream(bus: Bus) -> None:
    """``kmod.<role>`` is request/reply, not an event: the stream leaves it alone, so the only
    answer a requester gets is the responder's."""
    subject = bus.subjects.kmod_cmd("n1", "stats")

    async def responder(event: events.AnyEvent) -> events.Event:
        return events.KmodReply(node="n1", op="stats", status=0)

    await bus.serve(subject, responder)
    before = await bus.last_seq()
    reply = await bus.request(subject, events.KmodCommand(node="n1", op="stats"), timeout=2)
    assert isinstance(reply, events.KmodReply) and await bus.last_seq() == before


@given(st.text(min_size=1, max_size=40))
def test_keys_escape_to_one_token_and_back(key: str) -> None:
    escaped = escape_key(key)
    assert "." not in escaped and escaped.isascii() and " " not in escaped
    assert unescape_key(escaped) == key


def test_nats_errors_are_classified() -> None:
    assert isinstance(classify("x", nats.errors.TimeoutError()), Transient)
    assert isinstance(classify("x", nats.errors.NoRespondersError()), Transient)
    assert isinstance(classify("x", nats.errors.ConnectionClosedError()), Transient)
    assert isinstance(classify("x", nats.js.errors.ServiceUnavailableError()), Transient)
    assert isinstance(classify("x", nats.js.errors.KeyNotFoundError()), NotFound)
    assert isinstance(classify("x", nats.js.errors.NotFoundError(err_code=10059)), Transient)
    assert isinstance(classify("x", nats.js.errors.APIError(err_code=10008)), Transient)
    assert isinstance(classify("x", nats.js.errors.BadRequestError(err_code=10003)), Permanent)
    assert isinstance(classify("x", msgspec.DecodeError("bad")), Permanent)
    assert isinstance(classify("x", ConnectionResetError()), Transient)
    assert "KeyError" in str(classify("op", KeyError("k")))
