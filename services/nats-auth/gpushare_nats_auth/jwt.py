"""NATS JWTs (version 2): ``base64url(header).base64url(claims).base64url(ed25519 signature)``.

The header is ``{"typ":"JWT","alg":"ed25519-nkey"}``; the signature covers the
first two parts as text and is made by the issuer's nkey, whose public key is
the ``iss`` claim. ``jti`` is the base32 SHA-512/256 of the claims without it.
:func:`decode` checks the form, the algorithm, the issuer's role and the
signature, and returns the claims; anything else is a :class:`JwtError`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import time
from typing import Any

import msgspec

from . import nkey

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
_encode = msgspec.json.Encoder(order="sorted").encode


class JwtError(ValueError):
    """Not a NATS JWT signed as it should be (the message says which part and why)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str, part: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise JwtError(f"the JWT's {part} is not base64url") from None


def _json(raw: bytes, part: str) -> dict[str, Any]:
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        raise JwtError(f"the JWT's {part} is not JSON") from None
    if not isinstance(value, dict):
        raise JwtError(f"the JWT's {part} is not a JSON object")
    return value


def _jti(claims: dict[str, Any]) -> str:
    digest = hashlib.new("sha512_256", _encode({**claims, "jti": ""})).digest()
    return base64.b32encode(digest).decode().rstrip("=")


def encode(claims: dict[str, Any], issuer: nkey.Signer, now: float | None = None) -> str:
    """``claims`` signed by ``issuer`` (``iss``, ``iat`` and ``jti`` are set here)."""
    body = {**claims, "iss": issuer.public, "iat": int(time.time() if now is None else now)}
    body["jti"] = _jti(body)
    signing_input = f"{_b64(_encode(HEADER))}.{_b64(_encode(body))}"
    return f"{signing_input}.{_b64(issuer.sign(signing_input.encode()))}"


def unverified_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT, its signature unchecked (for a token someone else verified)."""
    parts = token.split(".")
    if len(parts) != 3:
        raise JwtError(f"not a JWT (expected three dot-separated parts, got {len(parts)})")
    return _json(_unb64(parts[1], "claims"), "claims")


def decode(token: str, issuer_role: str) -> dict[str, Any]:
    """The claims of a JWT signed by an nkey of ``issuer_role``; :class:`JwtError` otherwise."""
    claims = unverified_claims(token)
    head, body, signature = token.split(".")
    header = _json(_unb64(head, "header"), "header")
    if str(header.get("typ", "")).upper() != "JWT" or str(header.get("alg", "")).lower() != HEADER["alg"]:
        raise JwtError(f"the JWT's header {header} is not typ JWT, alg {HEADER['alg']}")
    issuer = claims.get("iss")
    if not isinstance(issuer, str):
        raise JwtError("the JWT names no issuer (iss)")
    try:
        valid = nkey.verify(issuer, issuer_role, f"{head}.{body}".encode(), _unb64(signature, "signature"))
    except nkey.NkeyError as err:
        raise JwtError(f"the JWT's issuer: {err}") from None
    if not valid:
        raise JwtError(f"the JWT's signature does not verify with its issuer {issuer}")
    return claims
