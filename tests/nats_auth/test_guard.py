"""The cheap checks a token meets before the API is asked: a parser of untrusted text, so every
input gives an expiry or a :class:`Refused` with its reason, never anything else."""

from __future__ import annotations

import time

import pytest
from gpushare_nats_auth.guard import Verdicts, precheck, token_key
from gpushare_nats_auth.handlers import Refused, Review
from gpushare_nats_auth.settings import AuthSettings
from hypothesis import given
from hypothesis import strategies as st

from tests.nats_auth.requests import sa_token

TABLE = AuthSettings().role_table()
NOW = time.time()


@pytest.mark.parametrize(("token", "reason"), [
    ("", "no-token"),
    ("solver-please", "malformed-token"),
    ("a.b.c", "malformed-token"),
    (sa_token("x", audience="kubernetes"), "wrong-audience"),
    (sa_token("x", expires=int(NOW) - 1), "token-expired"),
    (sa_token("x", account="default:default"), "unknown-account"),
    (sa_token("x", account="gpushare-system"), "unknown-account"),
])  # fmt: skip
def test_refused_before_any_review(token: str, reason: str) -> None:
    with pytest.raises(Refused) as caught:
        precheck(token, "gpushare-nats", TABLE, NOW)
    assert caught.value.reason == reason


def test_a_plausible_token_is_worth_a_review() -> None:
    assert precheck(sa_token("x", expires=int(NOW) + 60), "gpushare-nats", TABLE, NOW) == int(NOW) + 60


@given(st.text(max_size=200) | st.builds(lambda a, b, c: f"{a}.{b}.{c}", st.text(max_size=40),
                                          st.text(max_size=80), st.text(max_size=10)))
def test_any_text_gives_an_expiry_or_a_refusal(token: str) -> None:
    try:
        assert isinstance(precheck(token, "gpushare-nats", TABLE, NOW), int)
    except Refused as err:
        assert err.reason in {"no-token", "malformed-token", "wrong-audience", "token-expired", "unknown-account"}


def test_verdicts_are_kept_by_hash_until_the_token_expires() -> None:
    now = [NOW]
    verdicts = Verdicts(2, lambda: now[0])
    review = Review(True, "system:serviceaccount:gpushare-system:gpushare-solver", "n1")
    verdicts.keep("token-a", review, int(NOW) + 10)
    assert verdicts.get("token-a") == review and verdicts.get("token-b") is None
    assert "token-a" not in token_key("token-a")  # the token itself is never kept
    now[0] += 11
    assert verdicts.get("token-a") is None
    for name in ("t1", "t2", "t3"):  # bounded: the least recently used goes first
        verdicts.keep(name, review, int(NOW) + 100)
    assert len(verdicts) == 2 and verdicts.get("t1") is None
