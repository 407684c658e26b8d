"""Renewing a connection authorised by a token before that authorisation ends.

An auth callout grants a connection until its token expires; the server then ends it with
``User Authentication Expired``, which nats-py treats as final (it closes the connection and
never reconnects, nats.py issue 1019). So a bus connected with a token file reconnects on its
own shortly before the token it presented expires: the reconnect reads the file again (the
kubelet has rotated a projected token at 80% of its lifetime), keeps every subscription, and
the callout grants the new token. Renewal comes at ``expiry - margin`` (a tenth of the token's
lifetime, at most a minute).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import math
import time
from collections.abc import Awaitable, Callable

from ..logging import get_logger
from .errors import FAILURES

MAX_MARGIN_S = 60.0
log = get_logger("bus")


def token_expiry(token: str) -> float | None:
    """The ``exp`` of a JWT (its signature unchecked: the server's callout checks it), or None."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return None
    expires = claims.get("exp") if isinstance(claims, dict) else None
    return float(expires) if isinstance(expires, int | float) and not isinstance(expires, bool) else None


def renew_in(expires: float, issued: float, now: float | None = None) -> float:
    """Seconds from ``now`` until a connection whose token was read at ``issued`` should renew."""
    now = time.time() if now is None else now
    margin = min(MAX_MARGIN_S, max(expires - issued, 0.0) / 10)
    renew_at = expires - margin
    delay = max(renew_at - now, 0.0)
    while delay > 0.0 and now + delay > renew_at:  # rounding must not put the renewal past its instant
        delay = max(delay - math.ulp(now + delay), 0.0)
    return delay


class Renewal:
    """Tracks the token a connection presented and reconnects before it expires."""

    def __init__(self, service: str) -> None:
        self.service = service
        self._token: tuple[float, float] | None = None  # (expiry, read at) of the token presented
        self._task: asyncio.Task[None] | None = None

    def presented(self, token: str) -> None:
        """Called with each token the connection presents (at every connect)."""
        expires = token_expiry(token)
        self._token = None if expires is None else (expires, time.time())

    def start(self, reconnect: Callable[[], Awaitable[None]]) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run(reconnect))
            self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("token renewal crashed: the connection ends when its token expires", service=self.service,
                      error=repr(task.exception()))  # fmt: skip

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self, reconnect: Callable[[], Awaitable[None]]) -> None:
        while True:
            token = self._token
            await asyncio.sleep(renew_in(*token) if token is not None else MAX_MARGIN_S)
            if token is None or self._token is not token:
                continue  # no expiry, or it reconnected meanwhile with a newer token
            log.info("renewing the NATS authorisation before the token expires", service=self.service,
                     expires_in_s=round(token[0] - time.time(), 1))  # fmt: skip
            try:
                await reconnect()
            except FAILURES as err:  # the next round retries
                log.warning("could not renew the NATS authorisation", service=self.service, error=repr(err))
