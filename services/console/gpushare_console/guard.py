"""Who may look, and how many may follow at once: the console's two FastAPI dependencies.

- :class:`Viewers` (``GPUSHARE_CONSOLE_AUTH``): ``none`` (the default: the chart keeps the
  console in the cluster, a ClusterIP Service reached with ``kubectl port-forward``) or
  ``token``: every page and API call carries ``Authorization: Bearer <token>``, which the
  Kubernetes API must authenticate (a TokenReview: a service-account token, or an OIDC ID token
  where the API server accepts those, e.g. put there by an OIDC proxy in front of the console);
  with ``GPUSHARE_CONSOLE_VIEWERS`` only those users (``name``) or groups (``group:name``) may
  look. A verdict is kept for ``review_cache_s`` by the token's hash, so a page's calls cost one
  review. No token or a refused one: 401; a stranger: 403.
- :class:`Streams` (``GPUSHARE_CONSOLE_MAX_STREAMS``): live update streams open at once; one
  more is refused at once (503 with ``Retry-After``), so a client cannot hold the console's
  memory and connections open without bound.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from cachetools import TTLCache
from fastapi import HTTPException, Request
from gpushare_common.adapters.kube import KubeError

from .settings import ConsoleSettings

Review = Callable[[str], Awaitable[dict[str, Any]]]  # a token -> its TokenReview status
_BEARER = "bearer "


class Viewers:
    def __init__(self, settings: ConsoleSettings, review: Review) -> None:
        self.settings = settings
        self.review = review
        self._verdicts: TTLCache[str, tuple[str, tuple[str, ...]] | None] = TTLCache(
            maxsize=1024, ttl=settings.review_cache_s)

    async def __call__(self, request: Request) -> None:
        if self.settings.auth == "none":
            return
        header = request.headers.get("authorization", "")
        token = header[len(_BEARER):].strip() if header.lower().startswith(_BEARER) else ""
        if not token:
            raise HTTPException(401, "the console asks for a bearer token (Authorization: Bearer <token>)",
                                headers={"WWW-Authenticate": "Bearer"})
        try:
            who = await self._who(token)
        except KubeError as err:
            raise HTTPException(503, f"cannot ask the Kubernetes API who this is: {err}") from None
        if who is None:
            raise HTTPException(401, "the Kubernetes API did not authenticate this token",
                                headers={"WWW-Authenticate": "Bearer"})
        if not self.may_look(*who):
            raise HTTPException(403, f"{who[0]} is not among the console's viewers (GPUSHARE_CONSOLE_VIEWERS)")

    async def _who(self, token: str) -> tuple[str, tuple[str, ...]] | None:
        """The token's user and groups, None when the API does not authenticate it."""
        key = hashlib.sha256(token.encode()).hexdigest()
        if key in self._verdicts:
            return self._verdicts[key]
        status = await self.review(token)
        user = status.get("user") or {}
        found = (str(user.get("username") or ""), tuple(str(g) for g in user.get("groups") or ())) \
            if status.get("authenticated") is True else None
        self._verdicts[key] = found
        return found

    def may_look(self, user: str, groups: tuple[str, ...]) -> bool:
        allowed = self.settings.viewers
        return not allowed or user in allowed or any(f"group:{g}" in allowed for g in groups)


class Streams:
    """Live update streams open now, at most ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0

    def check(self) -> None:
        """503 when ``limit`` streams are open (called before a stream's response starts)."""
        if self.open >= self.limit:
            raise HTTPException(503, f"{self.limit} live streams are open already (GPUSHARE_CONSOLE_MAX_STREAMS)",
                                headers={"Retry-After": "5"})

    async def follow(self, stream: AsyncIterator[str]) -> AsyncIterator[str]:
        """``stream``, counted while it is followed (a stream never started holds nothing)."""
        self.open += 1
        try:
            async for chunk in stream:
                yield chunk
        finally:
            self.open -= 1
