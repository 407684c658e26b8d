"""One backoff, one stop-aware wait, one retry, one supervised loop for every service.

- :class:`Backoff`: exponential delays from ``first_s`` to ``max_s`` with
  ``jitter`` (a share of the delay, 20% by default, so many nodes retrying after one
  outage do not retry in step); ``reset()`` after a success.
- :func:`wait_for_stop`: sleep ``seconds`` unless ``stop`` is set first.
- :func:`wait_any`: wait until one of some events is set (or a timeout passes).
- :func:`retry`: call ``attempt`` until it returns, retrying only what
  ``transient`` names, with the backoff, until ``stop`` or ``deadline_s``.
- :class:`Supervised`: a loop that runs *rounds* until ``stop`` (a watch, a session, a
  consumer's fetch, a publication): after a round that failed it waits the backoff, after
  one that made progress the backoff starts again from its first delay; between rounds it
  may wait for a ``wake`` event or ``every_s``. It logs one line when rounds start to fail
  (and when the reason changes) and one when they work again. Every wait ends when ``stop``
  is set. ``async for round_ in Supervised(...)``; the body says ``round_.progress()`` or
  ``round_.failed(err)``; what it does not catch ends the loop.

Why not tenacity or stamina: they retry one call until it succeeds; these loops run forever,
start again after progress, wake on events and stop on the service's stop event, which is
most of the code here.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
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


@dataclass
class Round:
    """One round of a :class:`Supervised` loop: how it went."""

    number: int
    progressed: bool = False
    failure: str = ""

    def progress(self) -> None:
        """It works (connected, delivered, published): the next failure waits the first delay."""
        self.progressed = True

    def failed(self, reason: BaseException | str) -> None:
        """It failed: the next round comes after the backoff's delay."""
        self.failure = (str(reason) or repr(reason)) if isinstance(reason, BaseException) else reason or "failed"


class Supervised:
    """Rounds until ``stop``, with a backoff after a failed one (see the module doc).

    ``wake`` and ``every_s``: before each round that follows no failure, wait until ``wake`` is
    set (it is cleared) or ``every_s`` passed; without either, the next round starts at once.
    :meth:`restart` forgets the failures and runs the next round now.
    """

    def __init__(self, what: str, stop: asyncio.Event, backoff: Backoff | None = None, *,
                 wake: asyncio.Event | None = None, every_s: float | None = None, **keys: object) -> None:
        self.what = what
        self.stop = stop
        self.backoff = backoff or Backoff()
        self.wake = wake
        self.every_s = every_s
        self.keys = keys
        self.failures = 0  # rounds failed in a row
        self._reason = ""  # the failure last logged
        self._now = asyncio.Event()

    def restart(self) -> None:
        self.backoff.reset()
        self.failures = 0
        self._now.set()

    def __aiter__(self) -> AsyncIterator[Round]:
        return self._rounds()

    async def _rounds(self) -> AsyncIterator[Round]:
        number = 0
        while not self.stop.is_set():
            if not await self._pause():
                return
            number += 1
            current = Round(number)
            yield current
            self._settle(current)

    async def _pause(self) -> bool:
        """Wait before the next round; False when stopping."""
        if self.failures:
            await wait_any(self.stop, self._now, timeout=self.backoff.next())
        elif self.wake is not None or self.every_s is not None:
            await wait_any(self.stop, self._now, *([self.wake] if self.wake else []), timeout=self.every_s)
            if self.wake is not None:
                self.wake.clear()
        self._now.clear()
        return not self.stop.is_set()

    def _settle(self, done: Round) -> None:
        if done.progressed:
            if self.failures and not done.failure:
                log.info("working again", what=self.what, after_failures=self.failures, **self.keys)
            self.backoff.reset()
            self.failures, self._reason = 0, ""
        if not done.failure:
            return
        self.failures += 1
        if done.failure != self._reason or self.failures in (10, 100, 1000):
            log.warning("failing; retrying with backoff", what=self.what, error=done.failure,
                        failures=self.failures, **self.keys)  # fmt: skip
            self._reason = done.failure
