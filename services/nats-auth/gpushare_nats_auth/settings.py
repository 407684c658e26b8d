"""Settings of the NATS auth callout (``GPUSHARE_AUTH_*``), read once in ``main()``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpushare_common.settings import CommonSettings, SettingsError, load, load_common

from .roles import RoleTable, default_roles

PREFIX = "GPUSHARE_AUTH_"
DEFAULT_PORT = 8086


@dataclass(frozen=True, slots=True)
class AuthSettings:
    # the issuer's secret: an account seed (SA…) or at least 32 characters of random text
    issuer_seed_file: str = "/etc/gpushare/nats-auth/issuer"
    audience: str = "gpushare-nats"  # the audience service-account tokens must carry
    roles: dict[str, str] = field(default_factory=default_roles)  # namespace/serviceaccount=role
    account: str = "$G"  # the NATS account users are placed in (server configuration mode)
    max_ttl_s: float = 3600.0  # a user's authorisation never outlives its token, nor this
    review_timeout_s: float = 1.5  # below the server's authorization timeout (2 s)
    workers: int = 16  # requests handled at once
    queue: str = "gpushare-nats-auth"  # replicas share the requests

    def __post_init__(self) -> None:
        for name in ("max_ttl_s", "review_timeout_s", "workers"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"GPUSHARE_AUTH_{name.upper()}", str(getattr(self, name)), "a positive number")
        if not self.audience:
            raise SettingsError("GPUSHARE_AUTH_AUDIENCE", "", "the audience of the services' tokens")

    def role_table(self) -> RoleTable:
        return RoleTable.parse(self.roles)


@dataclass(frozen=True, slots=True)
class Settings:
    common: CommonSettings
    auth: AuthSettings


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    env = dict(os.environ if environ is None else environ)
    settings = Settings(load_common(env, DEFAULT_PORT), load(AuthSettings, PREFIX, env))
    settings.auth.role_table()  # a bad table stops the start, naming GPUSHARE_AUTH_ROLES
    return settings
