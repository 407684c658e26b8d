"""The callout with a fake TokenReview (the adapter boundary): every request answered, every
refusal counted by role and reason, the API's silence bounded."""

from __future__ import annotations

import asyncio
import time

from gpushare_common.layout import Layout
from gpushare_nats_auth import jwt, nkey
from gpushare_nats_auth.adapters.tokenreview import ReviewUnavailable
from gpushare_nats_auth.callout import Callout, CalloutMetrics
from gpushare_nats_auth.handlers import Review
from gpushare_nats_auth.settings import AuthSettings
from prometheus_client import CollectorRegistry, generate_latest

from tests.nats_auth.requests import ISSUER, SERVER, signed_request, user_key

DETECTOR = "system:serviceaccount:gpushare-system:gpushare-detector"


class FakeReviewer:
    """Answers by token: ``reviews[token]`` is a Review, an exception to raise, or "hang"."""

    def __init__(self, reviews: dict[str, object]) -> None:
        self.reviews = reviews
        self.asked: list[str] = []

    async def review(self, token: str) -> Review:
        self.asked.append(token)
        answer = self.reviews[token]
        if answer == "hang":
            await asyncio.Event().wait()
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, Review)
        return answer


def callout(reviews: dict[str, object], **settings: object) -> tuple[Callout, CalloutMetrics, CollectorRegistry]:
    registry = CollectorRegistry()
    metrics = CalloutMetrics(registry)
    auth = AuthSettings(**settings)  # type: ignore[arg-type]
    return Callout(ISSUER, FakeReviewer(reviews), auth.role_table(), Layout(), auth, metrics), metrics, registry


def answer_of(raw: bytes) -> dict[str, object]:
    claims = jwt.decode(raw.decode(), nkey.ACCOUNT)
    assert claims["aud"] == SERVER.public
    return claims["nats"]  # type: ignore[no-any-return]


async def test_grants_and_refusals_are_answered_and_counted() -> None:
    service, metrics, registry = callout({
        "good": Review(True, DETECTOR, "gpu-node-1"),
        "unbound": Review(True, DETECTOR, ""),
        "forged": Review(False, error="invalid bearer token"),
    })  # fmt: skip
    granted = answer_of(await service.answer(signed_request("good")))
    assert jwt.decode(str(granted["jwt"]), nkey.ACCOUNT)["name"] == "detector@gpu-node-1"
    assert answer_of(await service.answer(signed_request("unbound"))) == {
        "error": "no-node", "type": "authorization_response", "version": 2}
    assert answer_of(await service.answer(signed_request("forged")))["error"] == "token-rejected"
    assert answer_of(await service.answer(signed_request("")))["error"] == "no-token"
    assert metrics.status() == {"grants": {"detector": 1},
                                "refusals": {"no-node": {"detector": 1}, "no-token": {"-": 1},
                                             "token-rejected": {"-": 1}}}  # fmt: skip
    text = generate_latest(registry).decode()
    assert 'gpushare_auth_refusals_total{reason="no-node",role="detector"} 1.0' in text
    assert "gpushare_auth_answer_seconds_count 4.0" in text


async def test_a_malformed_request_is_refused_at_once_and_counted() -> None:
    service, metrics, _ = callout({})
    assert await service.answer(b"garbage") == b""  # the server refuses an empty answer at once
    user = user_key()
    answered = await service.answer(signed_request(user=user, signer=ISSUER))  # signed by no server
    assert answer_of(answered)["error"] == "malformed-request"
    assert jwt.decode(answered.decode(), nkey.ACCOUNT)["sub"] == user
    assert metrics.status()["refusals"] == {"malformed-request": {"-": 2}}


async def test_an_unreachable_or_silent_api_is_a_refusal_within_the_timeout() -> None:
    service, metrics, _ = callout({"down": ReviewUnavailable("review a token: 503"), "slow": "hang"},
                                  review_timeout_s=0.2)  # fmt: skip
    assert answer_of(await service.answer(signed_request("down")))["error"] == "review-unavailable"
    started = time.monotonic()
    assert answer_of(await service.answer(signed_request("slow")))["error"] == "review-unavailable"
    assert time.monotonic() - started < 1.0
    assert metrics.status()["refusals"] == {"review-unavailable": {"-": 2}}
