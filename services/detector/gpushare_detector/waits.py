"""Small asyncio helpers shared by the detector's loops."""

from __future__ import annotations

import asyncio
import contextlib


async def wait_either(event: asyncio.Event, stop: asyncio.Event) -> None:
    """Return when ``event`` or ``stop`` is set."""
    waiters = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds`` unless ``stop`` is set first."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
