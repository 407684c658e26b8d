"""Authorization requests as nats-server builds them (signed by a server nkey), for the tests."""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Any

from gpushare_nats_auth import jwt, nkey
from gpushare_nats_auth.handlers import REQUEST_AUDIENCE

ISSUER = nkey.account_signer("issuer secret of the tests, thirty-two characters or more")
SERVER = nkey.signer(os.urandom(32), nkey.SERVER)


def user_key() -> str:
    return nkey.signer(os.urandom(32), nkey.USER).public


def request_claims(token: str = "a-token", user: str | None = None, **overrides: Any) -> dict[str, Any]:
    claims: dict[str, Any] = {
        "aud": REQUEST_AUDIENCE, "sub": ISSUER.public, "exp": int(time.time()) + 3600,
        "nats": {"server_id": {"id": SERVER.public, "name": "n", "host": "127.0.0.1"},
                 "user_nkey": user or user_key(),
                 "client_info": {"host": "10.1.2.3", "id": 7, "kind": "Client", "type": "nats"},
                 "connect_opts": {"auth_token": token, "name": "gpushare", "protocol": 1},
                 "type": "authorization_request", "version": 2},
    }  # fmt: skip
    claims.update(overrides)
    return claims


def signed_request(token: str = "a-token", signer: nkey.Signer = SERVER, **overrides: Any) -> bytes:
    return jwt.encode(request_claims(token, **overrides), signer).encode()


def sa_token(tag: str, account: str = "gpushare-system:gpushare-detector", audience: str = "gpushare-nats",
             expires: int | None = None) -> str:
    """A token shaped as the API server issues them (its signature is the API's to check, not
    the callout's): ``tag`` tells tokens apart."""
    claims = {"aud": [audience], "sub": f"system:serviceaccount:{account}", "jti": tag,
              "exp": int(time.time()) + 3600 if expires is None else expires}
    parts = [{"alg": "RS256", "typ": "JWT"}, claims]
    return ".".join([*(base64.urlsafe_b64encode(json.dumps(p).encode()).rstrip(b"=").decode() for p in parts), "c2ln"])
