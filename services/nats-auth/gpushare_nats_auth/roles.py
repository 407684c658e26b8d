"""Who is which role: Kubernetes service accounts mapped to the NATS roles of ``layout``.

``GPUSHARE_AUTH_ROLES`` lists ``<namespace>/<service account>=<role>`` pairs,
comma-separated. The installer is a static NATS user and never a token's role;
a role that acts for one node (``NODE_ROLES``) is granted only with a node.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpushare_common.layout import NODE_ROLES, ROLES
from gpushare_common.settings import SettingsError

VARIABLE = "GPUSHARE_AUTH_ROLES"
TOKEN_ROLES = tuple(r for r in ROLES if r != "installer")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a DNS label (namespaces)
_ACCOUNT = re.compile(r"[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?")  # a DNS subdomain (service accounts)
SERVICE_ACCOUNT_USER = "system:serviceaccount:"


@dataclass(frozen=True, slots=True)
class Account:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class RoleTableError(SettingsError):
    def __init__(self, raw: str, problem: str) -> None:
        super().__init__(VARIABLE, raw, f"namespace/serviceaccount=role pairs, comma-separated ({problem})")


def parse_account(text: str) -> Account | None:
    """``ns/name`` as an :class:`Account`, or None when it is not one."""
    namespace, slash, name = text.strip().partition("/")
    if not slash or not _NAME.fullmatch(namespace) or not _ACCOUNT.fullmatch(name):
        return None
    return Account(namespace, name)


def account_of_user(username: str) -> Account | None:
    """The service account of a TokenReview username ``system:serviceaccount:<ns>:<name>``."""
    if not username.startswith(SERVICE_ACCOUNT_USER):
        return None
    namespace, colon, name = username[len(SERVICE_ACCOUNT_USER):].partition(":")
    return parse_account(f"{namespace}/{name}") if colon else None


@dataclass(frozen=True, slots=True)
class RoleTable:
    roles: Mapping[Account, str]

    def role_of(self, account: Account) -> str | None:
        return self.roles.get(account)

    @staticmethod
    def needs_node(role: str) -> bool:
        return role in NODE_ROLES

    @classmethod
    def parse(cls, pairs: Mapping[str, str], raw: str = "") -> RoleTable:
        """The table of ``{"ns/name": role}``; :class:`RoleTableError` names the first bad pair."""
        raw = raw or ",".join(f"{k}={v}" for k, v in pairs.items())
        roles: dict[Account, str] = {}
        for key, role in pairs.items():
            account = parse_account(key)
            if account is None:
                raise RoleTableError(raw, f"{key!r} is not namespace/serviceaccount")
            if role not in TOKEN_ROLES:
                raise RoleTableError(raw, f"{key}: role {role!r} is not one of {', '.join(TOKEN_ROLES)}")
            roles[account] = role
        if not roles:
            raise RoleTableError(raw, "no service account is given a role")
        return cls(roles)


def default_roles(namespace: str = "gpushare-system") -> dict[str, str]:
    """Each service's own account (``gpushare-<role>``) and the console as observer."""
    return {**{f"{namespace}/gpushare-{role}": role for role in NODE_ROLES},
            f"{namespace}/gpushare-console": "observer"}
