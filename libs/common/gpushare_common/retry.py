"""One backoff, one stop-aware wait, one retry loop for every service.

- :class:`Backoff`: exponential delays from ``first_s`` to ``max_s`` with
  ``jitter`` (a share of the delay, so many nodes retrying after one outage do
  not retry in step); ``reset()`` after a success.
- :func:`wait_for_stop`: sleep ``seconds`` unless ``stop`` is set first.
- :func:`wait_any`: wait until one of some events is set (or a timeout passes).
- :func:`retry`: call ``attempt`` until it returns, retrying only what
  ``transient`` names, with the backoff, until ``stop`` or ``deadline_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from .logging import get_logger

T = TypeVar("T")
log = get_logger("retry")


class Stopped(Exception):
    """The retry loop ended because the service is stopping (or its deadline passed)."""


@dataclass
class Backoff:
    first_s: float = 0.05
    max_s: float = 5.0
    factor: float = 2.0
    jitter: float = 0.2
    _next: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.max_s or self.factor < 1 or not 0 <= self.jitter < 1:
            raise ValueError(f"bad backoff {self.first_s}..{self.max_s} x{self.factor} ±{self.jitter}")
        self._next = self.first_s

    def next(self) -> float:
        """The next delay (grows until ``max_s``)."""
        delay = self._next
        self._next = min(self._next * self.factor, self.max_s)
        return delay * (1 + random.uniform(-self.jitter, self.jitter))

    def reset(self) -> None:
        self._next = self.first_s

    def delay_for(self, attempt: int) -> float:
        """The delay before attempt ``attempt`` (1 = the first retry), without state."""
        return min(self.first_s * self.factor ** max(attempt - 1, 0), self.max_s)


async def wait_for_stop(stop: asyncio.Event | None, seconds: float) -> bool:
    """Sleep ``seconds``; True when ``stop`` was set (at once or meanwhile)."""
    if stop is None:
        await asyncio.sleep(seconds)
        return False
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=max(seconds, 0.0))
    return stop.is_set()


async def wait_any(*events: asyncio.Event, timeout: float | None = None) -> bool:
    """Wait until one of ``events`` is set, at most ``timeout`` seconds; True when one is."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return any(event.is_set() for event in events)


async def retry(
    attempt: Callable[[], Awaitable[T]],
    transient: tuple[type[BaseException], ...],
    what: str,
    stop: asyncio.Event | None = None,
    backoff: Backoff | None = None,
    deadline_s: float | None = None,
    **keys: object,
) -> T:
    """Run ``attempt`` until it succeeds; a ``transient`` error is logged and retried.

    Raises :class:`Stopped` when ``stop`` is set or ``deadline_s`` passes first, and
    any non-transient error at once.
    """
    backoff = backoff or Backoff()
    ends = None if deadline_s is None else time.monotonic() + deadline_s
    tries = 0
    while True:
        try:
            return await attempt()
        except transient as err:
            tries += 1
            delay = backoff.next()
            if ends is not None and time.monotonic() + delay > ends:
                raise Stopped(f"{what}: still failing after {tries} tries: {err}") from err
            if tries == 1 or tries % 10 == 0:
                log.warning("retrying", what=what, tries=tries, error=str(err), retry_in_s=round(delay, 3),
                            **keys)
            if await wait_for_stop(stop, delay):
                raise Stopped(f"{what}: stopping after {tries} tries: {err}") from err
