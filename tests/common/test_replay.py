"""gpushare-events: replay a window of the stream, filtered, printed or re-published."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpushare_common import events
from gpushare_common.bus import Bus
from gpushare_common.bus.install import install
from gpushare_common.bus.replay import Filter, Printer, UsageError, describe, parse_time, replay
from gpushare_common.settings import NatsSettings, load
from gpushare_nats_auth.natsconf import static_users
from prometheus_client import CollectorRegistry

from tests.support.nats import NatsServer


async def _publish_sample(bus: Bus) -> list[events.Event]:
    await bus.wait_for_stream()
    sample: list[events.Event] = [
        events.SpotEvent(node="n1", pod="spot/a", container="c", state="using", devices=("spot-G0",)),
        events.OwnerBackEvent(node="n1", pidns=99, pid=5, kernel_ts_ns=1, pod="dev/owner"),
        events.SpotEvent(node="n2", pod="spot/b", container="c", state="cleared"),
    ]
    subjects = [bus.subjects.event("n1", "spot"), bus.subjects.event("n1", "ownerback"),
                bus.subjects.event("n2", "spot")]
    for subject, event in zip(subjects, sample, strict=True):
        await bus.publish_persistent(subject, event)
    await bus.publish_bytes(subjects[0], b"garbage")
    await bus.flush()
    return sample


async def test_replay_prints_filtered_window(nats_settings: NatsSettings) -> None:
    bus = Bus(nats_settings, "test", CollectorRegistry())
    await bus.connect()
    sample = await _publish_sample(bus)
    out = io.StringIO()
    count = await replay(bus, Filter(kind="spot"), Printer(False, out), parse_time("5m"), None)
    lines = out.getvalue().splitlines()
    assert count == 2 and len(lines) == 2
    assert "n1 spot" in lines[0] and "pod=spot/a" in lines[0] and "devices=spot-G0" in lines[0]
    out = io.StringIO()
    assert await replay(bus, Filter(node="n1", pod="dev/"), Printer(True, out), None, None) == 1
    assert events.decode(out.getvalue().strip().encode()) == sample[1]
    assert await replay(bus, Filter(), Printer(False, io.StringIO()), None, None, from_seq=3) == 1
    await bus.drain()


async def test_replay_republishes_to_sandbox_prefix(nats_settings: NatsSettings) -> None:
    bus = Bus(nats_settings, "test", CollectorRegistry())
    await bus.connect()
    sample = await _publish_sample(bus)
    received: list[events.AnyEvent] = []
    sandbox = nats_settings.prefix.replace(".v1", "_sandbox.v1")

    async def collect(event: events.AnyEvent) -> None:
        received.append(event)

    await bus.subscribe(f"{sandbox}.>", collect)
    assert await replay(bus, Filter(node="n1"), Printer(False, io.StringIO()), None, None,
                        republish_to=sandbox) == 2
    async with asyncio.timeout(5):
        while len(received) < 2:
            await asyncio.sleep(0.01)
    assert received == sample[:2]
    await bus.drain()


def test_parse_time() -> None:
    now = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)
    assert parse_time("10m", now) == now - dt.timedelta(minutes=10)
    assert parse_time("2026-01-01T10:00:00", now).tzinfo == dt.UTC
    with pytest.raises(UsageError, match="use a duration"):
        parse_time("yesterday", now)


def test_describe_is_one_line() -> None:
    line = describe(events.EvictionRecord(node="n1", pod="b/x", reason="owner-back", kill_ms=3.5), 7)
    assert "\n" not in line and "seq=7 n1 eviction pod=b/x reason=owner-back kill_ms=3.5" in line


def test_cli_reports_bad_arguments_clearly() -> None:
    result = subprocess.run([sys.executable, "-m", "gpushare_common.bus.replay", "replay", "--since", "x"],
                            capture_output=True, text=True, timeout=30,
                            env={"GPUSHARE_NATS_URL": "nats://127.0.0.1:1"})
    assert result.returncode == 2
    assert "error: bad time 'x'" in result.stderr


# --- the command line, as an operator runs it: the observer's identity on a server with users -------

PASSWORDS = {"detector": "pw-d", "observer": "pw-o", "installer": "pw-i"}


@pytest.fixture
def users_server(tmp_path: Path) -> Iterator[NatsServer]:
    """nats-server with one static user per role of node n1 (the users block compose's nats-config
    writes, from the same permissions the callout grants), passwords filled in."""
    block = re.sub(r"\$([A-Z_]+)_PASSWORD", lambda m: json.dumps(PASSWORDS.get(m.group(1).lower(), "unused")),
                   static_users("n1"))
    config = tmp_path / "nats.conf"
    config.write_text(block)
    server = NatsServer(config=str(config)).start()
    yield server
    server.cleanup()


def as_role(server: NatsServer, role: str, password: str = "") -> dict[str, str]:
    return {"GPUSHARE_NATS_URL": server.url, "GPUSHARE_NATS_USER": role,
            "GPUSHARE_NATS_PASSWORD": password or PASSWORDS[role]}


def events_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpushare_common.bus.replay", *args], capture_output=True,
                          text=True, timeout=60, env={"PATH": os.environ.get("PATH", ""), **env})


async def test_cli_replays_with_the_observers_identity(users_server: NatsServer) -> None:
    """The observer may not look streams up by subject ($JS.API.STREAM.NAMES): replay names its
    stream and reads it as the observer may."""
    settings = load(NatsSettings, "GPUSHARE_NATS_", as_role(users_server, "installer"))
    await install(settings, 30.0, "n1")
    bus = Bus(load(NatsSettings, "GPUSHARE_NATS_", as_role(users_server, "detector")), "detector", node="n1")
    await bus.connect()
    try:
        await bus.publish_persistent(bus.subjects.event("n1", "spot"), events.SpotEvent(
            node="n1", pod="spot/a", container="c", state="using", devices=("spot-G0",)))
    finally:
        await bus.drain()
    result = events_cli("replay", "--since", "5m", env=as_role(users_server, "observer"))
    assert result.returncode == 0, result.stderr
    assert "n1 spot" in result.stdout and "pod=spot/a" in result.stdout
    assert result.stderr.strip().splitlines() == ["1 events"]


def test_cli_says_in_one_line_that_the_credentials_were_refused(users_server: NatsServer) -> None:
    for env in (as_role(users_server, "observer", password="wrong"), {"GPUSHARE_NATS_URL": users_server.url}):
        result = events_cli("replay", env=env)
        assert result.returncode == 2
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"error: NATS at {users_server.url} refused the connection with ")
        assert "Authorization Violation" in line and "observer" in line


def test_cli_says_in_one_line_that_nats_is_unreachable() -> None:
    with socket.socket() as bound:  # bound, never listening, held: connections to it are refused
        bound.bind(("127.0.0.1", 0))
        unreachable = {"GPUSHARE_NATS_URL": f"nats://127.0.0.1:{bound.getsockname()[1]}"}
        result = events_cli("--connect-timeout", "1", "tail", env=unreachable)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: cannot reach NATS at nats://127.0.0.1:") and "within 1 s" in line


def test_cli_says_in_one_line_that_the_stream_does_not_exist(users_server: NatsServer) -> None:
    """Nothing installed on the server connected to (a node's stream lives on its leaf)."""
    result = events_cli("replay", env=as_role(users_server, "observer"))
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: no stream GPUSHARE on the server at {users_server.url}") and "--node" in line


def test_cli_says_in_one_line_what_the_observer_may_not_do(users_server: NatsServer) -> None:
    """Another stream than gpushare's: the observer's permissions stay as they are, and the
    refusal is said, not waited out as a timeout."""
    result = events_cli("--stream", "OTHER", "replay", env=as_role(users_server, "observer"))
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.lower().startswith("error: stream info other: nats refused $js.api.stream.info.other to the "
                                   "connection with user observer")  # the server writes the subject lowered
