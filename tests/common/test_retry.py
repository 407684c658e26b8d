"""The one supervised loop: backoff after failures (jitter on), progress starts it again, wake,
restart, one log line per transition, and every wait ends when the service stops."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from gpushare_common.retry import Backoff, Supervised
from gpushare_dra_driver.app import Service as DraDriver
from hypothesis import given
from hypothesis import strategies as st


class Recorded(Backoff):
    """A backoff that says which delays the loop asked for (and asks them to be short)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.asked: list[float] = []

    def next(self) -> float:
        self.asked.append(super().next())
        return 0.001


@given(st.floats(0.01, 10), st.floats(1, 4))
def test_jitter_is_on_by_default_and_stays_within_its_share(first: float, factor: float) -> None:
    backoff = Backoff(first, first * 100, factor)
    assert backoff.jitter > 0
    for step in range(6):
        nominal = min(first * factor**step, first * 100)
        assert nominal * (1 - backoff.jitter) <= backoff.next() <= nominal * (1 + backoff.jitter)


def test_nodes_do_not_retry_in_step() -> None:
    assert len({round(Backoff(1.0, 10.0).next(), 9) for _ in range(20)}) > 1


async def test_failures_back_off_and_progress_starts_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "gpushare.retry")
    stop, backoff = asyncio.Event(), Recorded(1.0, 8.0, jitter=0.1)
    outcomes = iter(["fail", "fail", "fail", "ok", "fail", "stop"])
    async for attempt in Supervised("test loop", stop, backoff, node="n1"):
        match next(outcomes):
            case "fail":
                attempt.failed(ConnectionError("refused"))
            case "ok":
                attempt.progress()
            case _:
                stop.set()
    assert [round(d) for d in backoff.asked] == [1, 2, 4, 1]  # doubling, then from the start again
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "gpushare.retry"]
    assert lines == [("WARNING", "failing; retrying with backoff"), ("INFO", "working again"),
                     ("WARNING", "failing; retrying with backoff")]


async def test_every_wait_ends_when_the_service_stops() -> None:
    stop = asyncio.Event()
    rounds = 0

    async def loop() -> None:
        nonlocal rounds
        async for attempt in Supervised("test loop", stop, Backoff(60.0, 60.0)):
            rounds += 1
            attempt.failed("down")

    task = asyncio.create_task(loop())
    async with asyncio.timeout(1):  # the first round ran; the loop waits its minute
        while rounds == 0:
            await asyncio.sleep(0.001)
    stop.set()
    await asyncio.wait_for(task, 1.0)
    assert rounds == 1


async def test_wake_every_and_restart() -> None:
    stop, wake = asyncio.Event(), asyncio.Event()
    seen: list[int] = []
    loop = Supervised("test loop", stop, Backoff(60.0, 60.0), wake=wake, every_s=60.0)

    async def run() -> None:
        async for attempt in loop:
            seen.append(attempt.number)
            if attempt.number == 2:
                attempt.failed("down")
            else:
                attempt.progress()

    task = asyncio.create_task(run())
    for expected in ([1], [1, 2]):
        wake.set()  # a round on each wake (none before it: every_s is a minute)
        async with asyncio.timeout(1):
            while seen != expected:
                await asyncio.sleep(0.001)
    loop.restart()  # the second failed: a minute of backoff, cut short
    async with asyncio.timeout(1):
        while seen != [1, 2, 3]:
            await asyncio.sleep(0.001)
    stop.set()
    await asyncio.wait_for(task, 1.0)


class PublishError(Exception):
    pass


async def test_the_dra_driver_slice_publication_stops_with_the_driver() -> None:
    """It backed off with asyncio.sleep in a loop that never looked at the stop event."""
    attempts = 0

    async def publish_slice(force: bool = False) -> bool:
        nonlocal attempts
        attempts += 1
        raise PublishError("the API server is away")

    health: dict[str, Any] = {}
    driver = SimpleNamespace(
        settings=SimpleNamespace(backoff_min_s=30.0, backoff_max_s=60.0, resync_s=60.0), stopping=asyncio.Event(),
        cards_changed=asyncio.Event(), published=None, node="n1", publish_slice=publish_slice,
        health=SimpleNamespace(set=lambda name, ok, reason="": health.update({name: (ok, reason)})))
    driver.cards_changed.set()
    task = asyncio.create_task(DraDriver._publish_loop(driver, PublishError))  # type: ignore[arg-type]
    async with asyncio.timeout(1):
        while attempts == 0:
            await asyncio.sleep(0.001)
    driver.stopping.set()
    await asyncio.wait_for(task, 1.0)
    assert attempts == 1 and health["slice"] == (False, "the API server is away")
