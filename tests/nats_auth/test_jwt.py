"""NATS JWTs and nkeys: round trips, signatures checked with the nkeys package, bad input refused."""

from __future__ import annotations

import base64
import os

import nkeys
import pytest
from gpushare_nats_auth import jwt, nkey
from hypothesis import given
from hypothesis import strategies as st

from tests.nats_auth.requests import ISSUER, SERVER


def test_round_trip_and_the_signature_verifies_with_nkeys() -> None:
    raw = os.urandom(32)
    seed = nkey.encode_seed(raw, nkey.ACCOUNT)
    signer = nkey.from_seed(seed, nkey.ACCOUNT)
    token = jwt.encode({"sub": "x", "nats": {"type": "user", "version": 2}}, signer, now=1000)
    claims = jwt.decode(token, nkey.ACCOUNT)
    assert claims["iss"] == signer.public and claims["iat"] == 1000 and claims["sub"] == "x"
    assert len(claims["jti"]) == 52  # base32 of a SHA-512/256 digest
    reference = nkeys.from_seed(seed.encode())
    assert reference.public_key.decode() == signer.public
    head, body, signature = token.split(".")
    assert reference.verify(f"{head}.{body}".encode(), base64.urlsafe_b64decode(signature + "=="))
    assert jwt.unverified_claims(token) == claims


def test_header_is_the_nats_one() -> None:
    token = jwt.encode({"sub": "x"}, ISSUER)
    header = base64.urlsafe_b64decode(token.split(".")[0] + "==")
    assert header == b'{"alg":"ed25519-nkey","typ":"JWT"}'


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


@pytest.mark.parametrize(("mangle", "expected"), [
    (lambda t: t + ".x", "three dot-separated parts"),
    (lambda t: t.replace(t.split(".")[1], _b64(b'{"iss":"%s","sub":"y"}' % ISSUER.public.encode())),
     "does not verify"),
    (lambda t: "eyJhbGciOiJIUzI1NiJ9." + t.split(".", 1)[1], "not typ JWT"),
    (lambda t: t.split(".")[0] + ".e30." + t.split(".")[2], "names no issuer"),
    (lambda t: t[:-1] + "!", "not base64url"),
])  # fmt: skip
def test_tampered_tokens_are_refused(mangle: object, expected: str) -> None:
    token = jwt.encode({"sub": "x", "nats": {}}, ISSUER)
    with pytest.raises(jwt.JwtError, match=expected):
        jwt.decode(mangle(token), nkey.ACCOUNT)  # type: ignore[operator]


def test_issuer_of_another_role_is_refused() -> None:
    token = jwt.encode({"sub": "x"}, SERVER)
    with pytest.raises(jwt.JwtError, match="not a account public key"):
        jwt.decode(token, nkey.ACCOUNT)


def test_issuer_secret_forms() -> None:
    raw = os.urandom(32)
    assert nkey.account_signer(nkey.encode_seed(raw, nkey.ACCOUNT)).public == nkey.signer(raw, nkey.ACCOUNT).public
    derived = nkey.account_signer("r" * 40)
    assert derived.public == nkey.account_signer("r" * 40 + "\n").public and derived.public.startswith("A")
    with pytest.raises(nkey.NkeyError, match="at least 32 characters"):
        nkey.account_signer("short")
    seed = nkey.encode_seed(raw, nkey.ACCOUNT)
    broken = seed[:-3] + ("A" if seed[-3] != "A" else "B") + seed[-2:]
    with pytest.raises(nkey.NkeyError, match="not a valid account seed"):
        nkey.account_signer(broken)
    with pytest.raises(nkey.NkeyError, match="not a valid account seed"):
        nkey.account_signer(nkey.encode_seed(raw, nkey.USER).replace("SU", "SA", 1))


def test_public_key_checks() -> None:
    user = nkey.signer(os.urandom(32), nkey.USER).public
    assert len(nkey.decode_public(user, nkey.USER)) == 32
    with pytest.raises(nkey.NkeyError, match="not a server public key"):
        nkey.decode_public(user, nkey.SERVER)
    flipped = user[:10] + ("A" if user[10] != "A" else "B") + user[11:]
    with pytest.raises(nkey.NkeyError, match="checksum"):
        nkey.decode_public(flipped, nkey.USER)


@given(st.binary(min_size=32, max_size=32), st.sampled_from([nkey.ACCOUNT, nkey.SERVER, nkey.USER]))
def test_public_keys_round_trip(raw: bytes, role: str) -> None:
    assert nkey.decode_public(nkey.encode_public(raw, role), role) == raw


@given(st.text(max_size=80))
def test_any_text_is_a_public_key_or_a_clear_error(text: str) -> None:
    try:
        nkey.decode_public(text, nkey.USER)
    except nkey.NkeyError as err:
        assert "user public key" in str(err)


@given(st.text(max_size=300) | st.lists(st.text(alphabet="abcAB01-_=", max_size=40), min_size=3, max_size=3)
       .map(".".join))  # fmt: skip
def test_any_text_is_a_jwt_or_a_clear_error(text: str) -> None:
    try:
        jwt.decode(text, nkey.ACCOUNT)
    except jwt.JwtError as err:
        assert "JWT" in str(err)
