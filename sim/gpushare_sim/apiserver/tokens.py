"""Service-account tokens: JSON Web Tokens signed by the emulator (HS256).

The key is made when the store is; tokens die with the emulator, as they would
with a cluster whose signing key changed. `sign` and `verify` know only the
JWS compact form; what the claims mean is `authn`'s.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

import msgspec

ISSUER = "https://kubernetes.default.svc.cluster.local"
API_AUDIENCES = (ISSUER,)  # the API server's own audience, as --api-audiences defaults
_ALGORITHM = "HS256"
_encode = msgspec.json.Encoder().encode


class TokenError(ValueError):
    """A string that is not a token this emulator signed."""


@dataclass(frozen=True, slots=True)
class SigningKey:
    secret: bytes
    key_id: str

    @classmethod
    def generate(cls) -> SigningKey:
        secret = secrets.token_bytes(32)
        return cls(secret, hashlib.sha256(secret).hexdigest()[:16])


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str, part: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise TokenError(f"the token's {part} is not base64url") from None


def _mac(key: SigningKey, signing_input: str) -> bytes:
    return hmac.new(key.secret, signing_input.encode(), hashlib.sha256).digest()


def sign(claims: dict[str, Any], key: SigningKey) -> str:
    header = {"alg": _ALGORITHM, "kid": key.key_id, "typ": "JWT"}
    signing_input = f"{_b64(_encode(header))}.{_b64(_encode(claims))}"
    return f"{signing_input}.{_b64(_mac(key, signing_input))}"


def verify(token: str, key: SigningKey) -> dict[str, Any]:
    """The claims of a token whose signature is this key's; TokenError otherwise."""
    parts = token.split(".")
    if len(parts) != 3:
        raise TokenError("not a JWT (expected three dot-separated parts)")
    header = _json(_unb64(parts[0], "header"), "header")
    if header.get("alg") != _ALGORITHM:
        raise TokenError(f"unexpected signing algorithm {header.get('alg')!r}")
    if not hmac.compare_digest(_unb64(parts[2], "signature"), _mac(key, f"{parts[0]}.{parts[1]}")):
        raise TokenError("the token's signature does not verify")
    return _json(_unb64(parts[1], "payload"), "payload")


def _json(raw: bytes, part: str) -> dict[str, Any]:
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        raise TokenError(f"the token's {part} is not JSON") from None
    if not isinstance(value, dict):
        raise TokenError(f"the token's {part} is not a JSON object")
    return value
