"""The auth callout's ``/status`` (its response model: ``/openapi.json``, ``/docs``)."""

from __future__ import annotations

from gpushare_common.http import ServiceStatus


class NatsAuthStatus(ServiceStatus):
    """The NATS auth callout: who signs, the requests waiting, the users let in and refused."""

    issuer: str
    """The issuer's public key (the server's configuration names it)."""
    audience: str
    pending: int
    """Authorization requests waiting for a TokenReview."""
    verdicts_kept: int
    """API verdicts kept (by the token's hash, each until its token expires)."""
    grants: dict[str, int]
    """Users let in, by role."""
    refusals: dict[str, dict[str, int]]
    """Users refused: reason -> role ("-" when none) -> count."""
