"""The NATS auth callout's settings: ``GPUSHARE_AUTH_*`` and the common topics, read once in ``main()``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from gpushare_common.settings import CommonSettings, SettingsError, topic

from .roles import RoleTable, default_roles

PREFIX = "GPUSHARE_AUTH_"


@dataclass(frozen=True, slots=True)
class AuthSettings:
    issuer_seed_file: str = "/etc/gpushare/nats-auth/issuer"
    """The issuer's secret: an account seed (SA...) or at least 32 characters of random text."""
    audience: str = "gpushare-nats"
    """The audience service-account tokens must carry."""
    roles: dict[str, str] = field(default_factory=default_roles)
    """Who gets which role: namespace/serviceaccount=role, comma-separated."""
    account: str = "$G"
    """The NATS account users are placed in (server configuration mode)."""
    max_ttl_s: float = 3600.0
    """A user's authorisation never outlives its token, nor this."""
    review_timeout_s: float = 1.5
    """How long one TokenReview may take (below the server's authorization timeout, 2 s)."""
    workers: int = 16
    """Requests handled at once."""
    queue: str = "gpushare-nats-auth"
    """The queue group replicas share the requests in."""
    queue_size: int = 256
    """Connects that may wait for a TokenReview at once (one more is refused, ``overloaded``)."""
    reviews_per_s: float = 50.0
    """TokenReviews started per second, at most."""
    cache_size: int = 4096
    """API verdicts kept, each until its token expires (by the token's hash)."""

    def __post_init__(self) -> None:
        for name in ("max_ttl_s", "review_timeout_s", "workers", "queue_size", "reviews_per_s", "cache_size"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"GPUSHARE_AUTH_{name.upper()}", str(getattr(self, name)), "a positive number")
        if not self.audience:
            raise SettingsError("GPUSHARE_AUTH_AUDIENCE", "", "the audience of the services' tokens")
        self.role_table()  # a bad table stops the start, naming GPUSHARE_AUTH_ROLES

    def role_table(self) -> RoleTable:
        return RoleTable.parse(self.roles)


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the auth callout reads."""

    DEFAULT_PORT: ClassVar[int] = 8086
    common: CommonSettings = field(default_factory=CommonSettings)
    auth: AuthSettings = topic(AuthSettings, PREFIX)
