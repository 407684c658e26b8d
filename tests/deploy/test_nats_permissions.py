"""k8s/base/nats.conf on a real nats-server: each service's user can do what it needs, nothing else."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import nats
import pytest
from gpushare_common import events
from gpushare_common.bus import Bus
from gpushare_common.settings import NatsSettings
from prometheus_client import CollectorRegistry

from tests.support import procs
from tests.support.nats import free_port

CONF = Path(__file__).resolve().parents[2] / "k8s" / "base" / "nats.conf"
PASSWORDS = {"DETECTOR_PASSWORD": "d-pw", "SOLVER_PASSWORD": "s-pw", "DEVICEPLUGIN_PASSWORD": "p-pw",
             "KMOD_BRIDGE_PASSWORD": "k-pw", "EVENTS_READER_PASSWORD": "r-pw"}
USERS = {"detector": "d-pw", "solver": "s-pw", "deviceplugin": "p-pw", "kmod-bridge": "k-pw",
         "events-reader": "r-pw"}


@pytest.fixture(scope="module")
def secured_nats() -> Iterator[str]:
    port, store = free_port(), tempfile.mkdtemp(prefix="gpushare-nats-perm-")
    conf = Path(store) / "nats.conf"  # the shipped file with this test's store directory
    conf.write_text(CONF.read_text().replace('store_dir: "/data/jetstream"', f'store_dir: "{store}/js"'))
    proc = subprocess.Popen(
        ["nats-server", "-c", str(conf), "-a", "127.0.0.1", "-p", str(port), "--http_port", str(free_port())],
        env={**os.environ, **PASSWORDS}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.allow(proc.pid)
    try:
        import socket
        import time
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(5)
        procs.disallow(proc.pid)


class Client:
    """A raw connection as one user, recording the server's permission errors."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc: nats.aio.client.Client | None = None

    async def connect(self, url: str, user: str) -> Client:
        async def on_error(err: Exception) -> None:
            self.errors.append(str(err))
        self.nc = await nats.connect(url, user=user, password=USERS[user], error_cb=on_error,
                                     max_reconnect_attempts=0)
        return self

    async def denied(self, action: str, subject: str) -> bool:
        assert self.nc is not None
        before = len(self.errors)
        if action == "pub":
            await self.nc.publish(subject, b"{}")
        else:
            await self.nc.subscribe(subject)
        await self.nc.flush()
        async with asyncio.timeout(2):
            while True:
                await self.nc.flush()
                if len(self.errors) > before:
                    return "permissions violation" in self.errors[-1].lower()
                probe_before = len(self.errors)
                await asyncio.sleep(0.05)
                if len(self.errors) == probe_before:
                    return False


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    made: list[Client] = []

    async def factory_close() -> None:
        for c in made:
            if c.nc is not None:
                await c.nc.close()
    client = Client()
    made.append(client)
    yield client
    await factory_close()


ALLOWED = [
    ("detector", "pub", "gpushare.v1.n1.event.spot"),
    ("detector", "pub", "gpushare.v1.n1.capacity.vcpu"),
    ("detector", "pub", "gpushare.v1.n1.kmod.cmd"),
    ("detector", "sub", "gpushare.v1.n1.event.ownerback"),
    ("solver", "pub", "gpushare.v1.n1.health.spot-gpu"),
    ("solver", "pub", "gpushare.v1.n1.eviction"),
    ("solver", "sub", "gpushare.v1.n1.event.*"),
    ("deviceplugin", "sub", "gpushare.v1.n1.health.*"),
    ("deviceplugin", "pub", "gpushare.v1.n1.event.inventory"),  # the DRA driver on a DRA node
    ("kmod-bridge", "pub", "gpushare.v1.n1.event.ownerback"),
    ("kmod-bridge", "sub", "gpushare.v1.n1.kmod.cmd"),
    ("events-reader", "sub", "gpushare.v1.>"),
]
DENIED = [
    ("detector", "pub", "gpushare.v1.n1.event.ownerback"),
    ("detector", "pub", "gpushare.v1.n1.health.spot-gpu"),
    ("detector", "pub", "gpushare.v1.n1.eviction"),
    ("detector", "pub", "$KV.gpushare-health.n1"),
    ("solver", "pub", "gpushare.v1.n1.event.ownerback"),
    ("deviceplugin", "pub", "gpushare.v1.n1.health.spot-gpu"),
    ("deviceplugin", "pub", "gpushare.v1.n1.event.spot"),
    ("deviceplugin", "pub", "$KV.gpushare-health.n1"),
    ("kmod-bridge", "pub", "gpushare.v1.n1.event.spot"),
    ("kmod-bridge", "pub", "gpushare.v1.n1.health.spot-gpu"),
    ("kmod-bridge", "sub", "gpushare.v1.n1.event.*"),
    ("events-reader", "pub", "gpushare.v1.n1.event.spot"),
    ("events-reader", "pub", "$JS.API.STREAM.DELETE.GPUSHARE"),
]


@pytest.mark.parametrize(("user", "action", "subject"), ALLOWED)
async def test_allowed(secured_nats: str, client: Client, user: str, action: str, subject: str) -> None:
    await client.connect(secured_nats, user)
    assert not await client.denied(action, subject)


@pytest.mark.parametrize(("user", "action", "subject"), DENIED)
async def test_denied(secured_nats: str, client: Client, user: str, action: str, subject: str) -> None:
    await client.connect(secured_nats, user)
    assert await client.denied(action, subject)


async def test_services_can_do_their_jetstream_work(secured_nats: str) -> None:
    base = NatsSettings(url=secured_nats, connect_timeout_s=2)
    solver = Bus(replace(base, user="solver", password=USERS["solver"]), "solver", CollectorRegistry())
    await solver.connect()
    await solver.wait_for_stream()
    health = await solver.store("health")
    await health.put("n1/spot-gpu", {"spot-GPU-0": "Healthy"})
    detector = Bus(replace(base, user="detector", password=USERS["detector"]), "detector", CollectorRegistry())
    await detector.connect()
    event = events.SpotEvent(node="n1", pod="b/x", container="c", state="using")
    assert await detector.publish_persistent(detector.subjects.event("n1", "spot"), event) > 0
    plugin = Bus(replace(base, user="deviceplugin", password=USERS["deviceplugin"]), "dp", CollectorRegistry())
    await plugin.connect()
    store = await plugin.store("health")
    assert await store.get("n1/spot-gpu", dict) == {"spot-GPU-0": "Healthy"}
    with pytest.raises(Exception):  # noqa: B017  (the KV put has no permission: nats-py times out or errors)
        await asyncio.wait_for(store.put("n1/spot-gpu", {}), 3)
    for bus in (solver, detector, plugin):
        await bus.drain()
