"""Renewing a connection authorised by a token before that authorisation ends.

An auth callout grants a connection until its token expires; the server then ends it with
``User Authentication Expired``, which nats-py treats as final (it closes the connection and
never reconnects, nats.py issue 1019). So a bus connected with a token file reconnects on its
own shortly before the token it presented expires: the reconnect reads the file again (the
kubelet has rotated a projected token at 80% of its lifetime), keeps every subscription, and
the callout grants the new token. Renewal comes at ``expiry - margin`` (a tenth of the token's
lifetime, at most a minute).
"""

from __future__ import annotations

import base64
import binascii
import json
import time

MAX_MARGIN_S = 60.0


def token_expiry(token: str) -> float | None:
    """The ``exp`` of a JWT (its signature unchecked: the server's callout checks it), or None."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return None
    expires = claims.get("exp") if isinstance(claims, dict) else None
    return float(expires) if isinstance(expires, int | float) and not isinstance(expires, bool) else None


def renew_in(expires: float, issued: float, now: float | None = None) -> float:
    """Seconds from ``now`` until a connection whose token was read at ``issued`` should renew."""
    now = time.time() if now is None else now
    margin = min(MAX_MARGIN_S, max(expires - issued, 0.0) / 10)
    return max(expires - margin - now, 0.0)
