"""The auth callout's decisions, as pure functions of a request, a token review and the role table.

nats-server sends every connecting client's ``CONNECT`` to ``$SYS.REQ.USER.AUTH`` as
an *authorization request* JWT signed by the server's nkey (``iss`` ``N…``,
``aud`` ``nats-authorization-request``, ``sub`` the issuer's account key, the
client's token in ``nats.connect_opts.auth_token`` and the public user nkey the
answer must be for in ``nats.user_nkey``). The answer is an *authorization
response* JWT signed by the issuer (``sub`` that user nkey, ``aud`` the server's
id) that carries either a user JWT (``nats.jwt``) or a refusal (``nats.error``).

A grant's user JWT is scoped by ``Layout.permissions(role, node).as_jwt()`` and
expires with the token (or ``max_ttl_s`` earlier); the server disconnects the
client then, and the client reconnects with its rotated token.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from gpushare_common.layout import Layout
from gpushare_common.subjects import AUTH_CALLOUT

from . import jwt, nkey
from .roles import Account, RoleTable, account_of_user

AUTH_SUBJECT = AUTH_CALLOUT
REQUEST_AUDIENCE = "nats-authorization-request"
CLOCK_SKEW_S = 5
_NO_LIMIT = {"subs": -1, "data": -1, "payload": -1}


class Refused(Exception):
    """A connection refused: ``reason`` is the counted label, ``detail`` the logged why."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


class _ServerId(msgspec.Struct):
    id: str
    name: str = ""


class _ClientInfo(msgspec.Struct):
    host: str = ""
    name: str = ""
    user: str = ""


class _ConnectOpts(msgspec.Struct):
    auth_token: str = ""
    user: str = ""
    name: str = ""


class _Request(msgspec.Struct):
    server_id: _ServerId
    user_nkey: str
    client_info: _ClientInfo = msgspec.field(default_factory=_ClientInfo)
    connect_opts: _ConnectOpts = msgspec.field(default_factory=_ConnectOpts)


@dataclass(frozen=True, slots=True)
class AuthRequest:
    user_nkey: str  # the subject every answer must name
    server_id: str  # the audience every answer must name
    client_host: str
    client_name: str
    token: str


@dataclass(frozen=True, slots=True)
class Review:
    """What the Kubernetes API said of a token (a TokenReview's status)."""

    authenticated: bool
    username: str = ""
    node: str = ""  # user.extra["authentication.kubernetes.io/node-name"]
    audiences: tuple[str, ...] = ()
    error: str = ""
    pod: str = ""  # user.extra["authentication.kubernetes.io/pod-name"] (a token bound to a pod)


@dataclass(frozen=True, slots=True)
class Grant:
    role: str
    account: Account
    node: str  # a node role's node; the observer's instance (its pod, which names its consumers)
    expires: int  # Unix seconds


def _request_fields(claims: dict[str, object]) -> _Request:
    try:
        request = msgspec.convert(claims.get("nats"), _Request)
    except msgspec.ValidationError as err:
        raise Refused("malformed-request", f"the request's nats claim: {err}") from None
    try:
        nkey.decode_public(request.user_nkey, nkey.USER)
        nkey.decode_public(request.server_id.id, nkey.SERVER)
    except nkey.NkeyError as err:
        raise Refused("malformed-request", str(err)) from None
    return request


def parse_request(raw: bytes, issuer: str, now: float) -> AuthRequest:
    """The request in ``raw``, signed by a server, for ``issuer``, not expired; else :class:`Refused`."""
    try:
        claims = jwt.decode(raw.decode("utf-8", "replace").strip(), nkey.SERVER)
    except jwt.JwtError as err:
        raise Refused("malformed-request", str(err)) from None
    if claims.get("aud") != REQUEST_AUDIENCE or claims.get("sub") != issuer:
        raise Refused("malformed-request", f"the request is for {claims.get('sub')!r} (aud {claims.get('aud')!r}), "
                      f"not for issuer {issuer} (aud {REQUEST_AUDIENCE})")  # fmt: skip
    expires = claims.get("exp")
    if isinstance(expires, int) and expires + CLOCK_SKEW_S < now:
        raise Refused("malformed-request", f"the request expired at {expires}")
    request = _request_fields(claims)
    return AuthRequest(request.user_nkey, request.server_id.id, request.client_info.host,
                       request.connect_opts.name or request.client_info.name, request.connect_opts.auth_token)


def presented_token(raw: bytes) -> str:
    """The token a request carries, read without checking the request's signature (cheap: for
    refusing a token that is not worth more; a grant still needs :func:`parse_request`)."""
    try:
        claims = jwt.unverified_claims(raw.decode("utf-8", "replace").strip())
    except jwt.JwtError as err:
        raise Refused("malformed-request", str(err)) from None
    nats = claims.get("nats")
    opts = nats.get("connect_opts") if isinstance(nats, dict) else None
    token = opts.get("auth_token", "") if isinstance(opts, dict) else None
    if not isinstance(token, str):
        raise Refused("malformed-request", "the request's nats claim has no connect_opts")
    return token


def reply_target(raw: bytes) -> tuple[str, str] | None:
    """``(user nkey, server id)`` of a request that did not parse, to answer it with an error."""
    try:
        request = _request_fields(jwt.unverified_claims(raw.decode("utf-8", "replace").strip()))
    except (jwt.JwtError, Refused):
        return None
    return request.user_nkey, request.server_id.id


def token_expiry(token: str) -> int | None:
    """The ``exp`` of a service-account token (read after the API verified the token)."""
    try:
        expires = jwt.unverified_claims(token).get("exp")
    except jwt.JwtError:
        return None
    return expires if isinstance(expires, int) and not isinstance(expires, bool) else None


def check_review(review: Review, audience: str) -> Account:
    if not review.authenticated:
        raise Refused("token-rejected", review.error or "the API did not authenticate the token")
    if review.audiences and audience not in review.audiences:
        raise Refused("wrong-audience", f"the token is for {list(review.audiences)}, not {audience}")
    account = account_of_user(review.username)
    if account is None:
        raise Refused("not-a-service-account", f"{review.username!r} is not a service account")
    return account


def decide(review: Review, token: str, table: RoleTable, audience: str, now: float, max_ttl_s: float) -> Grant:
    """The grant for a reviewed token, or :class:`Refused` with the reason."""
    account = check_review(review, audience)
    role = table.role_of(account)
    if role is None:
        raise Refused("unknown-account", f"service account {account} has no NATS role")
    if table.needs_node(role) and not review.node:
        raise Refused("no-node", f"{account} ({role}) presented a token bound to no node")
    expires = token_expiry(token)
    if expires is not None and expires <= now:
        raise Refused("token-expired", f"the token of {account} expired at {expires}")
    cap = int(now + max_ttl_s)
    node = review.node if table.needs_node(role) else (_instance(review.pod) if role == "observer" else "")
    return Grant(role, account, node, cap if expires is None else min(expires, cap))


def _instance(pod: str) -> str:
    """The observer's instance: its pod's name when the token is bound to one (a DNS subdomain
    without dots is a subject token), else the one shared instance ``console``."""
    return pod if pod and "." not in pod else ""


def user_claims(grant: Grant, request: AuthRequest, layout: Layout, nats_account: str) -> dict[str, object]:
    """The user JWT's claims: the role's permissions on its node, expiring with the token."""
    permissions = layout.permissions(grant.role, grant.node).as_jwt()
    name = f"{grant.role}@{grant.node}" if grant.node else grant.role
    return {"sub": request.user_nkey, "aud": nats_account, "exp": grant.expires, "name": name,
            "nats": {**permissions, **_NO_LIMIT, "type": "user", "version": 2}}


def response(user_nkey: str, server_id: str, issuer: nkey.Signer, now: float, *, user_jwt: str = "",
             error: str = "") -> bytes:  # fmt: skip
    """The authorization response JWT: a user JWT (a grant) or an error (a refusal)."""
    answer: dict[str, object] = {"jwt": user_jwt} if user_jwt else {"error": error or "not authorized"}
    claims = {"sub": user_nkey, "aud": server_id,
              "nats": {**answer, "type": "authorization_response", "version": 2}}  # fmt: skip
    return jwt.encode(claims, issuer, now).encode()


def grant_response(grant: Grant, request: AuthRequest, issuer: nkey.Signer, layout: Layout, nats_account: str,
                   now: float) -> bytes:  # fmt: skip
    user_jwt = jwt.encode(user_claims(grant, request, layout, nats_account), issuer, now)
    return response(request.user_nkey, request.server_id, issuer, now, user_jwt=user_jwt)
