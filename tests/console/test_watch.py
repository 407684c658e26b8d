"""The console's NATS reads as the ``observer`` role on a real nats-server with the layout's
permissions: a bucket followed by :meth:`Bus.watch_bucket` (its keys, each change, a fresh
start after the server restarted), the stream read by direct gets, and nothing written."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import pytest
from gpushare_common.bus import Bus, BusError
from gpushare_common.bus.watch import KeyChanges
from gpushare_common.events import EvictionRecord
from gpushare_common.layout import Layout
from gpushare_common.mapping import OwnerEntry
from gpushare_common.settings import NatsSettings
from gpushare_sim.natsd import static_users
from prometheus_client import CollectorRegistry

from tests.support.nats import NatsServer

PASSWORDS = {"installer": "installer-pw", "observer": "observer-pw"}


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[NatsServer]:
    layout = Layout()
    users = [(role, PASSWORDS[role], layout.permissions(role).as_config()) for role in PASSWORDS]
    config = tmp_path / "nats.conf"
    config.write_text(static_users(users) + "\n")
    server = NatsServer(config=str(config)).start()
    yield server
    server.cleanup()


async def _bus(server: NatsServer, role: str) -> Bus:
    settings = NatsSettings(url=server.url, user=role, password=PASSWORDS[role], reconnect_wait_s=0.1)
    bus = Bus(settings, role, CollectorRegistry())
    await bus.connect()
    return bus


@pytest.fixture
async def buses(secured: NatsServer) -> AsyncIterator[tuple[Bus, Bus]]:
    installer = await _bus(secured, "installer")
    await installer.ensure_layout()
    observer = await _bus(secured, "observer")
    yield installer, observer
    await observer.drain()
    await installer.drain()


async def _next(changes: AsyncIterator[KeyChanges], timeout: float = 10.0) -> KeyChanges:
    return await asyncio.wait_for(anext(changes), timeout)


async def test_the_observer_follows_a_bucket_key_by_key(buses: tuple[Bus, Bus]) -> None:
    installer, observer = buses
    store = await installer.store("solver", installer.layout.scope("node-a", "mapping"))
    await store.put("ml/dev", OwnerEntry(owner="ml/dev", kind="reserved"))
    stop = asyncio.Event()
    changes = observer.watch_bucket("solver", ">", stop, heartbeat_s=0.5)
    first = await _next(changes)
    assert first.reset and [c.key for c in first.changes] == ["node-a.mapping.ml/dev"]
    assert msgspec.json.decode(first.changes[0].value or b"", type=OwnerEntry).kind == "reserved"
    await store.put("ml/other", OwnerEntry(owner="ml/other"))
    second = await _next(changes)
    assert not second.reset and [c.key for c in second.changes] == ["node-a.mapping.ml/other"]
    await store.delete("ml/dev")
    third = await _next(changes)
    assert [(c.key, c.value) for c in third.changes] == [("node-a.mapping.ml/dev", None)]
    stop.set()
    await changes.aclose()


async def test_an_empty_bucket_starts_with_an_empty_reset(buses: tuple[Bus, Bus]) -> None:
    _, observer = buses
    stop = asyncio.Event()
    changes = observer.watch_bucket("health", ">", stop, heartbeat_s=0.5)
    first = await _next(changes)
    assert first.reset and first.changes == ()
    stop.set()
    await changes.aclose()


async def test_after_a_server_restart_the_watch_starts_again_with_every_key(
        secured: NatsServer, buses: tuple[Bus, Bus]) -> None:  # fmt: skip
    installer, observer = buses
    store = await installer.store("health", installer.layout.scope("node-a", "health"))
    await store.put("spot-gpu", {"devices": {"spot-GPU-0": "Healthy"}})
    stop = asyncio.Event()
    changes = observer.watch_bucket("health", ">", stop, heartbeat_s=0.3)
    assert (await _next(changes)).reset
    secured.restart()
    again = await _next(changes, timeout=30)
    assert again.reset and [c.key for c in again.changes] == ["node-a.health.spot-gpu"]
    stop.set()
    await changes.aclose()


async def test_the_observer_reads_the_stream_and_writes_nothing(buses: tuple[Bus, Bus]) -> None:
    installer, observer = buses
    record = EvictionRecord(node="node-a", pod="ml/spot", reason="owner-back", total_ms=12.5)
    await installer.publish_persistent(installer.subjects.eviction("node-a"), record)
    found = await observer.read_after(f"{observer.subjects.prefix}.*.eviction", 0)
    assert [m.event() for m in found] == [record]
    store = await observer.store("solver", observer.layout.scope("node-a", "mapping"))
    with pytest.raises(BusError):
        await asyncio.wait_for(store.put("ml/x", OwnerEntry(owner="ml/x")), 15)
    with pytest.raises(BusError):
        await observer.publish_persistent(observer.subjects.eviction("node-a"), record)
