"""One authorization request in, one answer out: parse, review the token, decide, sign.

Every request gets an answer, never silence: a grant, or an error response that
the server turns into an immediate refusal (an empty reply when the request is so
malformed that no answer can name its user). Each refusal is logged with its
reason, the service account, the node and the client's address, and counted.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from gpushare_common.layout import Layout
from gpushare_common.logging import get_logger
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client import Counter as Metric

from .adapters.tokenreview import ReviewUnavailable
from .handlers import AuthRequest, Grant, Refused, Review, decide, grant_response, parse_request, reply_target, response
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

    async def answer(self, raw: bytes) -> bytes:
        """The response to one request (bytes to publish to its reply subject)."""
        started, now = time.monotonic(), self.clock()
        try:
            request = parse_request(raw, self.issuer.public, now)
        except Refused as why:
            return self._malformed(raw, why, now)
        try:
            grant = await self._grant(request, now)
        except Refused as why:
            return self._refuse(request, why, now)
        finally:
            self.metrics.seconds.observe(time.monotonic() - started)
        self.metrics.grant(grant.role)
        log.info("connection granted", role=grant.role, account=str(grant.account), node=grant.node or UNKNOWN,
                 client=request.client_host, expires_in_s=int(grant.expires - now))  # fmt: skip
        return grant_response(grant, request, self.issuer, self.layout, self.settings.account, now)

    async def _grant(self, request: AuthRequest, now: float) -> Grant:
        if not request.token:
            raise Refused("no-token", f"no token presented (user {request.client_name or UNKNOWN!r})")
        try:
            review = await asyncio.wait_for(self.reviewer.review(request.token), self.settings.review_timeout_s)
        except ReviewUnavailable as err:
            raise Refused("review-unavailable", str(err)) from None
        except TimeoutError:
            raise Refused("review-unavailable", f"no TokenReview answer in {self.settings.review_timeout_s}s") from None
        try:
            return decide(review, request.token, self.table, self.settings.audience, now, self.settings.max_ttl_s)
        except Refused as why:
            raise _Explained(why, review) from None

    def _refuse(self, request: AuthRequest, why: Refused, now: float) -> bytes:
        review = why.review if isinstance(why, _Explained) else None
        account = account_of_user(review.username) if review is not None else None
        role = (self.table.role_of(account) if account is not None else None) or UNKNOWN
        self.metrics.refuse(role, why.reason)
        log.warning("connection refused", reason=why.reason, detail=why.detail, role=role,
                    account=str(account) if account else (review.username if review else UNKNOWN) or UNKNOWN,
                    node=(review.node if review else "") or UNKNOWN, client=request.client_host)  # fmt: skip
        return response(request.user_nkey, request.server_id, self.issuer, now, error=why.reason)

    def _malformed(self, raw: bytes, why: Refused, now: float) -> bytes:
        self.metrics.refuse(UNKNOWN, why.reason)
        log.warning("malformed authorization request", reason=why.reason, detail=why.detail, size=len(raw))
        target = reply_target(raw)
        return b"" if target is None else response(*target, self.issuer, now, error=why.reason)


class _Explained(Refused):
    """A refusal with the review it was decided on (for the log line)."""

    def __init__(self, why: Refused, review: Review) -> None:
        super().__init__(why.reason, why.detail)
        self.review = review
