"""One authorization request in, one answer out: parse, review the token, decide, sign.

Every request gets an answer, never silence: a grant, or an error response that
the server turns into an immediate refusal (an empty reply when the request is so
malformed that no answer can name its user). Each refusal is logged with its
reason, the service account, the node and the client's address, and counted.

Two steps, so that a flood cannot starve a real connect (:mod:`.guard`):
:meth:`Callout.triage` answers at once whatever needs no TokenReview (a malformed
request, a token the cheap checks refuse, a token whose verdict is kept) and
hands the rest on as a :class:`Ticket`; :meth:`Callout.review` asks the API for
one ticket, at most ``reviews_per_s`` a second, within the time the server waits.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiolimiter import AsyncLimiter
from gpushare_common.layout import Layout
from gpushare_common.logging import get_logger
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client import Counter as Metric

from .adapters.tokenreview import ReviewUnavailable
from .guard import Verdicts, precheck
from .handlers import (
    AuthRequest,
    Grant,
    Refused,
    Review,
    decide,
    grant_response,
    parse_request,
    presented_token,
    reply_target,
    response,
)
from .nkey import Signer
from .roles import RoleTable, account_of_user
from .settings import AuthSettings

log = get_logger("nats-auth")
UNKNOWN = "-"


class Reviewer(Protocol):
    async def review(self, token: str) -> Review: ...


class CalloutMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.grants = Metric("gpushare_auth_grants", "Connections granted, by role", ["role"], registry=registry)
        self.refusals = Metric("gpushare_auth_refusals", "Connections refused, by role and reason",
                               ["role", "reason"], registry=registry)  # fmt: skip
        self.seconds = Histogram("gpushare_auth_answer_seconds", "Time to answer one authorization request",
                                 registry=registry, buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2))
        self.verdicts = Metric("gpushare_auth_verdicts", "Token verdicts used, by where they came from (api, kept)",
                               ["source"], registry=registry)
        self.granted: Counter[str] = Counter()
        self.refused: Counter[tuple[str, str]] = Counter()

    def grant(self, role: str) -> None:
        self.grants.labels(role).inc()
        self.granted[role] += 1

    def refuse(self, role: str, reason: str) -> None:
        self.refusals.labels(role, reason).inc()
        self.refused[(role, reason)] += 1

    def status(self) -> dict[str, Any]:
        refusals: dict[str, dict[str, int]] = {}
        for (role, reason), count in sorted(self.refused.items()):
            refusals.setdefault(reason, {})[role] = count
        return {"grants": dict(sorted(self.granted.items())), "refusals": refusals}


@dataclass(frozen=True, slots=True)
class Ticket:
    """A request whose token the API must review."""

    request: AuthRequest
    expires: int  # the token's own expiry (its verdict is kept until then)
    received: float  # monotonic seconds


class Callout:
    def __init__(self, issuer: Signer, reviewer: Reviewer, table: RoleTable, layout: Layout, settings: AuthSettings,
                 metrics: CalloutMetrics, clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.issuer = issuer
        self.reviewer = reviewer
        self.table = table
        self.layout = layout
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.verdicts = Verdicts(settings.cache_size, clock)
        self.limiter = AsyncLimiter(settings.reviews_per_s, 1.0)
        self.quiet = Quiet()

    async def answer(self, raw: bytes) -> bytes:
        """The response to one request (bytes to publish to its reply subject)."""
        found = self.triage(raw)
        return found if isinstance(found, bytes) else await self.review(found)

    def triage(self, raw: bytes) -> bytes | Ticket:
        """The answer, when it needs no TokenReview; else the :class:`Ticket` to review. A token the
        cheap checks refuse is answered empty (the server refuses such a client at once) before
        anything costly: the request's signature is checked only for a token worth more."""
        started, now = time.monotonic(), self.clock()
        try:
            expires = precheck(presented_token(raw), self.settings.audience, self.table, now)
        except Refused as why:
            return self._cheap_refusal(why)
        try:
            request = parse_request(raw, self.issuer.public, now)
        except Refused as why:
            return self._malformed(raw, why, now)
        kept = self.verdicts.get(request.token)
        if kept is None:
            return Ticket(request, expires, started)
        self.metrics.verdicts.labels("kept").inc()
        return self._decided(request, kept, now, started)

    async def review(self, ticket: Ticket) -> bytes:
        """Ask the API about one ticket's token (within the time the server still waits), then decide."""
        request, now = ticket.request, self.clock()
        left = self.settings.review_timeout_s - (time.monotonic() - ticket.received)
        try:
            await asyncio.wait_for(self.limiter.acquire(), max(0.0, left))
            left = self.settings.review_timeout_s - (time.monotonic() - ticket.received)
            review = await asyncio.wait_for(self.reviewer.review(request.token), max(0.0, left))
        except ReviewUnavailable as err:
            return self._refuse(request, Refused("review-unavailable", str(err)), now)
        except TimeoutError:
            return self._refuse(request, Refused("review-unavailable", "no TokenReview answer within "
                                                 f"{self.settings.review_timeout_s}s (reviews are limited to "
                                                 f"{self.settings.reviews_per_s}/s)"), now)
        self.metrics.verdicts.labels("api").inc()
        self.verdicts.keep(request.token, review, ticket.expires)
        return self._decided(request, review, self.clock(), ticket.received)

    def overloaded(self, ticket: Ticket) -> bytes:
        """The answer to a ticket that found the review queue full."""
        return self._refuse(ticket.request, Refused("overloaded", f"{self.settings.queue_size} connects already "
                                                    "wait for a TokenReview"), self.clock())

    def _decided(self, request: AuthRequest, review: Review, now: float, started: float) -> bytes:
        try:
            grant = decide(review, request.token, self.table, self.settings.audience, now, self.settings.max_ttl_s)
        except Refused as why:
            return self._refuse(request, _Explained(why, review), now)
        finally:
            self.metrics.seconds.observe(time.monotonic() - started)
        return self._granted(grant, request, now)

    def _granted(self, grant: Grant, request: AuthRequest, now: float) -> bytes:
        self.metrics.grant(grant.role)
        log.info("connection granted", role=grant.role, account=str(grant.account), node=grant.node or UNKNOWN,
                 client=request.client_host, expires_in_s=int(grant.expires - now))  # fmt: skip
        return grant_response(grant, request, self.issuer, self.layout, self.settings.account, now)

    def _refuse(self, request: AuthRequest, why: Refused, now: float) -> bytes:
        review = why.review if isinstance(why, _Explained) else None
        account = account_of_user(review.username) if review is not None else None
        role = (self.table.role_of(account) if account is not None else None) or UNKNOWN
        self.metrics.refuse(role, why.reason)
        if review is not None or (more := self.quiet.next(why.reason)) is not None:
            log.warning("connection refused", reason=why.reason, detail=why.detail, role=role,
                        account=str(account) if account else (review.username if review else UNKNOWN) or UNKNOWN,
                        node=(review.node if review else "") or UNKNOWN, client=request.client_host,
                        **({"also_refused": more} if review is None and more else {}))  # fmt: skip
        return response(request.user_nkey, request.server_id, self.issuer, now, error=why.reason)

    def _cheap_refusal(self, why: Refused) -> bytes:
        self.metrics.refuse(UNKNOWN, why.reason)
        if (more := self.quiet.next(why.reason)) is not None:
            log.warning("connection refused", reason=why.reason, detail=why.detail,
                        **({"also_refused": more} if more else {}))
        return b""

    def _malformed(self, raw: bytes, why: Refused, now: float) -> bytes:
        self.metrics.refuse(UNKNOWN, why.reason)
        if (more := self.quiet.next(why.reason)) is not None:
            log.warning("malformed authorization request", reason=why.reason, detail=why.detail, size=len(raw),
                        **({"also_refused": more} if more else {}))
        target = reply_target(raw)
        return b"" if target is None else response(*target, self.issuer, now, error=why.reason)


class Quiet:
    """One log line per reason per ``every_s`` for refusals nobody was asked about (a flood of
    garbage must not become a flood of log lines); the line says how many it stands for."""

    def __init__(self, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self._last: dict[str, tuple[float, int]] = {}

    def next(self, reason: str) -> int | None:
        """None: stay quiet; else the number of refusals of ``reason`` not logged since the last line."""
        now = self.clock()
        last, skipped = self._last.get(reason, (-self.every_s, 0))
        if now - last < self.every_s:
            self._last[reason] = (last, skipped + 1)
            return None
        self._last[reason] = (now, 0)
        return skipped


class _Explained(Refused):
    """A refusal with the review it was decided on (for the log line)."""

    def __init__(self, why: Refused, review: Review) -> None:
        super().__init__(why.reason, why.detail)
        self.review = review
