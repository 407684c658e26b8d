"""The callout with a fake TokenReview (the adapter boundary): every request answered, every
refusal counted by role and reason, the API's silence bounded; under a flood, cheap checks
first, verdicts kept, reviews bounded."""

from __future__ import annotations

import asyncio
import base64
import json
import time

from gpushare_common.layout import Layout
from gpushare_nats_auth import jwt, nkey
from gpushare_nats_auth.adapters.tokenreview import ReviewUnavailable
from gpushare_nats_auth.callout import Callout, CalloutMetrics, Ticket
from gpushare_nats_auth.guard import Verdicts
from gpushare_nats_auth.handlers import Review
from gpushare_nats_auth.settings import AuthSettings
from prometheus_client import CollectorRegistry, generate_latest

from tests.nats_auth.requests import ISSUER, SERVER, sa_token, signed_request, user_key

DETECTOR = "system:serviceaccount:gpushare-system:gpushare-detector"


def tag_of(token: str) -> str:
    """The tag :func:`sa_token` wrote into a token (its ``jti``)."""
    body = token.split(".")[1]
    return str(json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))["jti"])


class FakeReviewer:
    """Answers by token tag (:func:`sa_token`): ``reviews[tag]`` is a Review, an exception to raise, or "hang"."""

    def __init__(self, reviews: dict[str, object]) -> None:
        self.reviews = reviews
        self.asked: list[str] = []

    async def review(self, token: str) -> Review:
        self.asked.append(token)
        answer = self.reviews[tag_of(token)]  # the tag, not the token: one made a second later expires later
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
    granted = answer_of(await service.answer(signed_request(sa_token("good"))))
    assert jwt.decode(str(granted["jwt"]), nkey.ACCOUNT)["name"] == "detector@gpu-node-1"
    assert answer_of(await service.answer(signed_request(sa_token("unbound")))) == {
        "error": "no-node", "type": "authorization_response", "version": 2}
    assert answer_of(await service.answer(signed_request(sa_token("forged"))))["error"] == "token-rejected"
    assert await service.answer(signed_request("")) == b""  # refused at once: the server's own refusal
    assert metrics.status() == {"grants": {"detector": 1},
                                "refusals": {"no-node": {"detector": 1}, "no-token": {"-": 1},
                                             "token-rejected": {"-": 1}}}  # fmt: skip
    text = generate_latest(registry).decode()
    assert 'gpushare_auth_refusals_total{reason="no-node",role="detector"} 1.0' in text
    assert "gpushare_auth_answer_seconds_count 3.0" in text  # the tokenless refusal asks nobody


async def test_a_malformed_request_is_refused_at_once_and_counted() -> None:
    service, metrics, _ = callout({})
    assert await service.answer(b"garbage") == b""  # the server refuses an empty answer at once
    user = user_key()
    answered = await service.answer(signed_request(sa_token("x"), user=user, signer=ISSUER))  # signed by no server
    assert answer_of(answered)["error"] == "malformed-request"
    assert jwt.decode(answered.decode(), nkey.ACCOUNT)["sub"] == user
    assert metrics.status()["refusals"] == {"malformed-request": {"-": 2}}


async def test_an_unreachable_or_silent_api_is_a_refusal_within_the_timeout() -> None:
    service, metrics, _ = callout({"down": ReviewUnavailable("review a token: 503"), "slow": "hang"},
                                  review_timeout_s=0.2)  # fmt: skip
    assert answer_of(await service.answer(signed_request(sa_token("down"))))["error"] == "review-unavailable"
    started = time.monotonic()
    assert answer_of(await service.answer(signed_request(sa_token("slow"))))["error"] == "review-unavailable"
    assert time.monotonic() - started < 1.0
    assert metrics.status()["refusals"] == {"review-unavailable": {"-": 2}}


async def test_cheap_checks_refuse_without_asking_the_api() -> None:
    service, metrics, _ = callout({})
    for token, reason in (("not-a-jwt", "malformed-token"), (sa_token("x", audience="kubernetes"), "wrong-audience"),
                          (sa_token("x", expires=int(time.time()) - 1), "token-expired"),
                          (sa_token("x", account="default:default"), "unknown-account")):
        assert await service.answer(signed_request(token)) == b"", reason
        assert metrics.refused[("-", reason)] == 1
    assert service.reviewer.asked == []  # type: ignore[attr-defined]


async def test_a_verdict_is_kept_for_its_tokens_lifetime() -> None:
    now = [time.time()]
    service, metrics, _ = callout({"good": Review(True, DETECTOR, "gpu-node-1")})
    service.verdicts = Verdicts(8, lambda: now[0])
    token = sa_token("good")  # one token, shown three times (one made a second later is another token)
    for _ in range(3):
        assert "jwt" in answer_of(await service.answer(signed_request(token)))
    assert len(service.reviewer.asked) == 1 and metrics.granted["detector"] == 3  # type: ignore[attr-defined]
    now[0] += 3601  # past the token's expiry: no verdict kept (and the cheap check refuses it too)
    assert service.verdicts.get(token) is None


async def test_reviews_are_bounded_per_second_and_a_late_one_is_refused() -> None:
    service, _, _ = callout({f"t{i}": Review(True, DETECTOR, "gpu-node-1") for i in range(4)},
                            reviews_per_s=1.0, review_timeout_s=0.5)
    tickets = [service.triage(signed_request(sa_token(f"t{i}"))) for i in range(4)]
    assert all(isinstance(t, Ticket) for t in tickets)
    answers = await asyncio.gather(*(service.review(t) for t in tickets))  # type: ignore[arg-type]
    granted = [a for a in answers if "jwt" in answer_of(a)]
    assert len(granted) == 1, "one review a second: the others wait past the server's patience"
    assert {answer_of(a).get("error") for a in answers if a not in granted} == {"review-unavailable"}


def test_a_full_queue_is_refused_with_its_reason() -> None:
    service, metrics, _ = callout({})
    ticket = service.triage(signed_request(sa_token("waiting")))
    assert isinstance(ticket, Ticket)
    assert answer_of(service.overloaded(ticket))["error"] == "overloaded"
    assert metrics.refused[("-", "overloaded")] == 1
