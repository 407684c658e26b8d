"""What keeps the callout answering under a flood of connects: cheap checks first, verdicts kept,
TokenReviews bounded.

Every connect costs the server one authorization request, and a request that reaches the API
costs a TokenReview; a flood of garbage tokens must not queue a real service's connect behind
thousands of reviews, nor hammer the API server:

- :func:`precheck` reads the token's own claims, unverified (no network, microseconds): a
  token that is not a JWT, is for another audience, has expired, or names a service account
  without a NATS role is refused at once. What passes is only *plausible*: the API still
  decides (a forged token can pass these checks, and then costs one review);
- :class:`Verdicts` keeps each API verdict, keyed by the token's SHA-256, until the token
  expires (bounded, least recently used first out): a service reconnecting with its token is
  answered without asking again. A verdict the API could not give (unavailable) is not kept;
- the rest waits in a bounded queue (``GPUSHARE_AUTH_QUEUE_SIZE``; a request that finds it full
  is refused at once, ``overloaded``), and reviews start at most ``GPUSHARE_AUTH_REVIEWS_PER_S``
  per second (a request that waited longer than the server waits for it is refused, ``stale``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from cachetools import TLRUCache

from . import jwt
from .handlers import Refused, Review
from .roles import Account, RoleTable, account_of_user


def precheck(token: str, audience: str, table: RoleTable, now: float) -> int:
    """The token's expiry when it may be worth a TokenReview; :class:`Refused` when it is not."""
    if not token:
        raise Refused("no-token", "no token presented")
    try:
        claims = jwt.unverified_claims(token)
    except jwt.JwtError as err:
        raise Refused("malformed-token", f"not a service-account token: {err}") from None
    audiences = claims.get("aud")
    listed = [audiences] if isinstance(audiences, str) else audiences if isinstance(audiences, list) else []
    if audience not in listed:
        raise Refused("wrong-audience", f"the token is for {listed}, not {audience}")
    expires = claims.get("exp")
    if not isinstance(expires, int) or isinstance(expires, bool):
        raise Refused("malformed-token", "the token has no expiry (exp)")
    if expires <= now:
        raise Refused("token-expired", f"the token expired at {expires}")
    account = _account(claims.get("sub"), table)
    if account is None:
        raise Refused("unknown-account", f"{claims.get('sub')!r} is no service account with a NATS role")
    return expires


def _account(subject: object, table: RoleTable) -> Account | None:
    account = account_of_user(subject) if isinstance(subject, str) else None
    return account if account is not None and table.role_of(account) is not None else None


def token_key(token: str) -> str:
    """What a verdict is kept under: never the token itself."""
    return hashlib.sha256(token.encode()).hexdigest()


class Verdicts:
    """API verdicts by token hash, each kept until its token expires (``clock``: Unix seconds)."""

    def __init__(self, size: int, clock: Callable[[], float]) -> None:
        self._cache: TLRUCache[str, tuple[Review, int]] = TLRUCache(
            maxsize=size, ttu=lambda _key, value, _now: float(value[1]), timer=clock)

    def get(self, token: str) -> Review | None:
        found = self._cache.get(token_key(token))
        return found[0] if found is not None else None

    def keep(self, token: str, review: Review, expires: int) -> None:
        self._cache[token_key(token)] = (review, expires)

    def __len__(self) -> int:
        return len(self._cache)
