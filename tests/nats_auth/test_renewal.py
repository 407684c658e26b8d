"""When a token-authorised bus renews its connection: the token's expiry, read from the JWT."""

from __future__ import annotations

import base64
import json

from gpushare_common.bus.renewal import MAX_MARGIN_S, renew_in, token_expiry
from hypothesis import given
from hypothesis import strategies as st


def jwt_with(claims: object) -> str:
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"eyJhbGciOiJSUzI1NiJ9.{body}.c2ln"


def test_expiry_of_a_token() -> None:
    assert token_expiry(jwt_with({"exp": 1700000000, "sub": "x"})) == 1700000000
    assert token_expiry(jwt_with({"sub": "x"})) is None
    assert token_expiry(jwt_with({"exp": True})) is None
    assert token_expiry(jwt_with(["exp"])) is None
    assert token_expiry("an opaque token") is None
    assert token_expiry("a.!!!.c") is None


def test_renewal_comes_a_tenth_of_the_lifetime_early_at_most_a_minute() -> None:
    assert renew_in(expires=1000.0, issued=0.0, now=0.0) == 1000.0 - MAX_MARGIN_S
    assert renew_in(expires=100.0, issued=0.0, now=0.0) == 90.0
    assert renew_in(expires=100.0, issued=0.0, now=95.0) == 0.0


@given(st.text(max_size=200))
def test_any_text_has_an_expiry_or_none(text: str) -> None:
    expires = token_expiry(text)
    assert expires is None or isinstance(expires, float)


@given(st.floats(0, 1e9), st.floats(0, 1e6), st.floats(0, 1e9))
def test_renewal_is_never_negative_nor_after_expiry(issued: float, lifetime: float, now: float) -> None:
    delay = renew_in(issued + lifetime, issued, now)
    assert delay >= 0 and (now + delay <= issued + lifetime or delay == 0)


def test_rounding_never_puts_the_renewal_past_the_expiry() -> None:
    # found by the property above: (expires - now) + now rounds one ulp past expires
    issued, now = 16777218.28670388, 1.360759174451232
    delay = renew_in(issued, issued, now)
    assert delay > 0 and now + delay <= issued
