"""Decoding authorization requests, deciding on reviewed tokens, and the signed answers."""

from __future__ import annotations

import time

import pytest
from gpushare_common.layout import Layout
from gpushare_nats_auth import handlers, jwt, nkey
from gpushare_nats_auth.adapters.tokenreview import review_of
from gpushare_nats_auth.handlers import Refused, Review
from gpushare_nats_auth.roles import RoleTable, default_roles
from hypothesis import given
from hypothesis import strategies as st

from tests.nats_auth.requests import ISSUER, SERVER, request_claims, signed_request, user_key

TABLE = RoleTable.parse(default_roles())
SOLVER = "system:serviceaccount:gpushare-system:gpushare-solver"
NOW = 1_700_000_000.0


def sa_token(exp: int | None) -> str:
    """A token's shape (the callout reads only its expiry; the API verified it)."""
    return jwt.encode({"sub": "system:serviceaccount:x:y", **({"exp": exp} if exp else {})}, ISSUER)


def test_a_server_request_parses() -> None:
    user = user_key()
    request = handlers.parse_request(signed_request("tok", user=user), ISSUER.public, time.time())
    assert (request.token, request.user_nkey, request.server_id) == ("tok", user, SERVER.public)
    assert request.client_host == "10.1.2.3" and request.client_name == "gpushare"


@pytest.mark.parametrize(("raw", "expected"), [
    (b"not a jwt", "three dot-separated parts"),
    (signed_request(signer=ISSUER), "not a server public key"),
    (signed_request(aud="elsewhere"), "not for issuer"),
    (signed_request(sub="AOTHER"), "not for issuer"),
    (signed_request(exp=int(time.time()) - 60), "expired"),
    (jwt.encode({**request_claims(), "nats": {"user_nkey": "U"}}, SERVER).encode(), "server_id"),
    (jwt.encode({**request_claims(), "nats": {**request_claims()["nats"], "user_nkey": SERVER.public}},
                SERVER).encode(), "not a user public key"),
])  # fmt: skip
def test_malformed_requests_are_refused(raw: bytes, expected: str) -> None:
    with pytest.raises(Refused, match=expected) as caught:
        handlers.parse_request(raw, ISSUER.public, time.time())
    assert caught.value.reason == "malformed-request"


@given(st.binary(max_size=400))
def test_any_bytes_are_a_request_or_a_refusal(raw: bytes) -> None:
    try:
        handlers.parse_request(raw, ISSUER.public, time.time())
    except Refused as why:
        assert why.reason == "malformed-request"
    handlers.reply_target(raw)  # never raises


def test_reply_target_of_a_badly_signed_request() -> None:
    user = user_key()
    assert handlers.reply_target(signed_request(user=user, signer=ISSUER)) == (user, SERVER.public)


def test_a_solver_token_bound_to_a_node_is_granted_that_node() -> None:
    review = Review(True, SOLVER, "gpu-node-1", ("gpushare-nats",))
    grant = handlers.decide(review, sa_token(int(NOW) + 600), TABLE, "gpushare-nats", NOW, 3600)
    assert (grant.role, grant.node, grant.expires) == ("solver", "gpu-node-1", int(NOW) + 600)
    capped = handlers.decide(review, sa_token(int(NOW) + 7200), TABLE, "gpushare-nats", NOW, 60)
    assert capped.expires == int(NOW) + 60
    unknown = handlers.decide(review, "opaque", TABLE, "gpushare-nats", NOW, 60)
    assert unknown.expires == int(NOW) + 60


@pytest.mark.parametrize(("review", "exp", "reason"), [
    (Review(False, error="token has expired"), 0, "token-rejected"),
    (Review(True, SOLVER, "n1", ("kubernetes",)), 0, "wrong-audience"),
    (Review(True, "system:node:n1", "n1"), 0, "not-a-service-account"),
    (Review(True, "system:serviceaccount:default:default", "n1"), 0, "unknown-account"),
    (Review(True, SOLVER, ""), 0, "no-node"),
    (Review(True, SOLVER, "n1"), int(NOW) - 1, "token-expired"),
])  # fmt: skip
def test_refusals(review: Review, exp: int, reason: str) -> None:
    with pytest.raises(Refused) as caught:
        handlers.decide(review, sa_token(exp or int(NOW) + 600), TABLE, "gpushare-nats", NOW, 3600)
    assert caught.value.reason == reason


def test_an_observer_needs_no_node_and_gets_none() -> None:
    review = Review(True, "system:serviceaccount:gpushare-system:gpushare-console", "n1")
    assert handlers.decide(review, "t", TABLE, "gpushare-nats", NOW, 60).node == ""


def test_an_observer_bound_to_its_pod_names_its_own_consumers() -> None:
    review = Review(True, "system:serviceaccount:gpushare-system:gpushare-console", "n1", pod="console-7d9f-x2")
    grant = handlers.decide(review, "t", TABLE, "gpushare-nats", NOW, 60)
    assert grant.node == "console-7d9f-x2"
    publish = Layout().permissions("observer", grant.node).publish
    follows = [(f"KV_gpushare-{b}", f"$KV.gpushare-{b}.>") for b in ("solver", "health")]
    follows.append(("GPUSHARE", "gpushare.v1.>"))
    assert [p for p in publish if "CONSUMER.CREATE" in p] == [
        f"$JS{domain}.API.CONSUMER.CREATE.{stream}.observer-console-7d9f-x2.{keys}"
        for domain in ("", ".*") for stream, keys in follows]


def test_the_grant_answer_carries_the_scoped_user() -> None:
    request = handlers.parse_request(signed_request("tok"), ISSUER.public, time.time())
    grant = handlers.decide(Review(True, SOLVER, "gpu-node-1"), "t", TABLE, "gpushare-nats", time.time(), 60)
    answer = jwt.decode(handlers.grant_response(grant, request, ISSUER, Layout(), "$G", time.time()).decode(),
                        nkey.ACCOUNT)  # fmt: skip
    assert (answer["sub"], answer["aud"], answer["iss"]) == (request.user_nkey, SERVER.public, ISSUER.public)
    assert answer["nats"]["type"] == "authorization_response" and "error" not in answer["nats"]
    user = jwt.decode(answer["nats"]["jwt"], nkey.ACCOUNT)
    assert (user["sub"], user["aud"], user["name"], user["exp"]) == (request.user_nkey, "$G", "solver@gpu-node-1",
                                                                      grant.expires)
    expected = Layout().permissions("solver", "gpu-node-1").as_jwt()
    assert {k: user["nats"][k] for k in expected} == expected
    assert (user["nats"]["subs"], user["nats"]["type"], user["nats"]["version"]) == (-1, "user", 2)


def test_the_refusal_answer_names_the_reason_only() -> None:
    user = user_key()
    answer = jwt.decode(handlers.response(user, SERVER.public, ISSUER, NOW, error="unknown-account").decode(),
                        nkey.ACCOUNT)  # fmt: skip
    assert answer["nats"] == {"error": "unknown-account", "type": "authorization_response", "version": 2}


def test_token_review_status_is_read_defensively() -> None:
    status = {"authenticated": True, "audiences": ["gpushare-nats"],
              "user": {"username": SOLVER, "extra": {"authentication.kubernetes.io/node-name": ["n1"]}}}
    assert review_of(status) == Review(True, SOLVER, "n1", ("gpushare-nats",))
    assert review_of({"user": {"extra": {"authentication.kubernetes.io/node-name": "n1"}}}).node == ""
    assert review_of({"error": "bad", "authenticated": "true"}) == Review(False, error="bad")


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                   max_size=3), max_leaves=10)


@given(st.dictionaries(st.sampled_from(["authenticated", "user", "audiences", "error"]), JSONISH))
def test_any_review_status_reads_as_a_review(status: dict[str, object]) -> None:
    review = review_of(status)
    assert review.authenticated == (status.get("authenticated") is True)
