"""The callout service against real servers (nats-server with the chart's config, the API
emulator, each node's leaf): an authorisation ends with its token and the client reconnects with
its rotated token; while the callout is down, connections made stay and new ones wait until it is
back. The clients here are the console's (the observer: the node services are users of their
node's leaf, which needs no callout); each proves it works by reading node A's stream through
that node's leaf."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from gpushare_common.bus import Bus, Transient
from gpushare_common.retry import retry
from gpushare_sim.apiserver.tokens import sign
from gpushare_sim.run.kubeapi import mint_node_token

from tests.deploy.nats_deployments import NODE_A, ChartNats, chart_nats


@pytest.fixture(scope="module")
def chart() -> Iterator[ChartNats]:
    with chart_nats() as running:
        yield running


def token_file(chart: ChartNats, tmp_path: Path, role: str) -> Path:
    path = tmp_path / f"{role}.token"
    path.write_text(chart.token(role, NODE_A))
    return path


def short_lived(chart: ChartNats, role: str, seconds: int) -> tuple[str, float]:
    """A token of ``role`` on NODE_A, as the API issues it, expiring in ``seconds``."""
    token = chart.token(role, NODE_A)
    body = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["exp"] = int(time.time()) + seconds
    signed = chart.kube.server.call(lambda store: sign(claims, store.signing_key), chart.kube.server.store)
    return str(signed), float(claims["exp"])


async def reads_node_a(chart: ChartNats, bus: Bus) -> bool:
    """The observer reads node A's stream, through the cluster and node A's leaf (which connects to
    the cluster again on its own after a restart of it: until then, nothing answers)."""
    seq = await retry(lambda: bus.last_seq(chart.domain(NODE_A)), (Transient,), "read node A's stream",
                      deadline_s=30)  # fmt: skip
    return seq >= 0


async def test_the_bus_renews_its_authorisation_with_the_rotated_token(chart: ChartNats, tmp_path: Path) -> None:
    """The server would end the connection when its token expires (and nats-py would not come
    back): the bus reconnects before, with the token the kubelet rotated into the file."""
    path = tmp_path / "observer.token"
    token, expires = short_lived(chart, "observer", 8)
    path.write_text(token)
    bus = Bus(replace(chart.settings("observer"), token="", token_file=str(path)), "observer")
    await bus.connect()
    changes: asyncio.Queue[bool] = asyncio.Queue()
    bus.on_state.append(changes.put_nowait)
    try:
        rotated = mint_node_token(chart.kube.kubeconfig, NODE_A, chart.accounts["observer"],
                                  audiences=[chart.audience])  # fmt: skip
        path.write_text(rotated.token)  # as the kubelet rotates a projected token
        assert await asyncio.wait_for(changes.get(), 20) is False  # the renewal's reconnect ...
        assert await asyncio.wait_for(changes.get(), 20) is True
        assert time.time() < expires  # ... before the first token's authorisation ended
        assert await reads_node_a(chart, bus)
        assert bus.is_connected
    finally:
        await bus.drain()


async def test_callout_down_keeps_connections_and_new_ones_wait(chart: ChartNats, tmp_path: Path) -> None:
    chart.restart_callout()  # a fresh one for this test's grant counts
    made = Bus(replace(chart.settings("observer"), token="", token_file=str(token_file(chart, tmp_path,
                                                                                        "observer"))), "observer")
    await made.connect()
    later = Bus(chart.settings("observer"), "observer")
    chart.restart_callout(down=True)
    log = chart.server.log
    refusals = log.read_text().count("authentication error")
    try:
        assert await reads_node_a(chart, made)
        connecting = asyncio.create_task(later.connect())
        while log.read_text().count("authentication error") == refusals:  # no answer: the server refused
            assert not connecting.done()
            await asyncio.wait_for(asyncio.shield(asyncio.sleep(0.05)), 1)
        assert not connecting.done() and not later.is_connected
        chart.restart_callout()
        await asyncio.wait_for(connecting, 30)
        assert later.is_connected and made.is_connected and made.reconnects == 0
    finally:
        await later.drain()
        await made.drain()


async def test_a_nats_restart_while_the_callout_is_down_reconnects_when_it_is_back(chart: ChartNats) -> None:
    bus = Bus(chart.settings("observer"), "observer")
    await bus.connect()
    changes: asyncio.Queue[bool] = asyncio.Queue()
    bus.on_state.append(changes.put_nowait)
    try:
        chart.restart_callout(down=True)
        chart.server.stop()
        assert await asyncio.wait_for(changes.get(), 10) is False
        chart.server.start()  # the reconnects are refused (no callout answers) and retried
        log = chart.server.log
        while log.read_text().count("authentication error") == 0:
            assert changes.empty()
            await asyncio.wait_for(asyncio.shield(asyncio.sleep(0.05)), 1)
        chart.restart_callout()
        assert await asyncio.wait_for(changes.get(), 30) is True
        assert await reads_node_a(chart, bus)
    finally:
        await bus.drain()
