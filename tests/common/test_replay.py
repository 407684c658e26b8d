"""gpushare-events: replay a window of the stream, filtered, printed or re-published."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import subprocess
import sys

import pytest
from gpushare_common import events
from gpushare_common.bus import Bus
from gpushare_common.bus.replay import Filter, Printer, UsageError, describe, parse_time, replay
from gpushare_common.settings import NatsSettings
from prometheus_client import CollectorRegistry


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
