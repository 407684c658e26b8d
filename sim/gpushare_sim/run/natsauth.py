"""NATS authorisation of the local cluster, as in Kubernetes: the auth callout.

nats-server knows two static users, the callout's ``auth`` and the ``installer``;
each node's leaf server presents a service-account token, minted through the API
emulator for ``gpushare-system/gpushare-leaf`` with audience ``gpushare-nats`` and
bound to its Node (the console's, as the observer, to no node), written into the
leaf's configuration and minted again before it expires (the leaf reloads it), as
the kubelet rotates a projected token. The callout (``gpushare-nats-auth``) checks
each token with a TokenReview and grants only that role's permissions on that
node, so every scenario proves the permissions are enough. The node's services
are users of their leaf (``leaves``).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpushare_common.settings import KUBE_PREFIX, NATS_PREFIX, KubeSettings, NatsSettings, env_of
from gpushare_nats_auth import settings as nats_auth

from gpushare_sim import natsd
from gpushare_sim.run.kubeapi import SERVICES_NAMESPACE, mint_token

AUDIENCE = "gpushare-nats"
TOKEN_LIFETIME_S = 3600
REFRESH_AT = 0.8  # of a token's lifetime, as the kubelet rotates projected tokens


@dataclass
class NatsAuth:
    directory: Path  # <run dir>/nats: configs, the issuer secret and its include
    auth_password: str = field(default_factory=lambda: secrets.token_hex(16))
    installer_password: str = field(default_factory=lambda: secrets.token_hex(16))
    tokens: dict[tuple[str, str], Path] = field(default_factory=dict)  # (service, node) -> token file

    @property
    def issuer_secret(self) -> Path:
        return self.directory / "issuer.secret"

    @property
    def issuer_include(self) -> Path:
        return self.directory / "issuer.conf"

    def prepare(self) -> None:
        """The issuer secret, and ``AUTH_ISSUER`` for the servers' configs (as the NATS pods'
        init container writes it in Kubernetes). Blocking: call it in a thread."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.issuer_secret.write_text(secrets.token_hex(32))
        self.issuer_secret.chmod(0o600)
        done = subprocess.run([sys.executable, "-m", "gpushare_nats_auth.natsconf", "issuer", "--secret",
                               str(self.issuer_secret), "--out", str(self.issuer_include)],
                              capture_output=True, text=True, check=False)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"gpushare-nats-conf issuer: {done.stderr.strip()}")

    def authorization(self) -> str:
        return natsd.callout_authorization(self.auth_password, self.installer_password, self.issuer_include.name)

    def installer(self) -> dict[str, str]:
        return {"user": "installer", "password": self.installer_password}

    def callout_env(self, nats_url: str, kubeconfig: Path) -> dict[str, str]:
        return {**env_of(NatsSettings, NATS_PREFIX, url=nats_url, user="auth", password=self.auth_password,
                         reconnect_wait_s=0.2),
                **env_of(nats_auth.AuthSettings, nats_auth.PREFIX, issuer_seed_file=str(self.issuer_secret),
                         audience=AUDIENCE),
                **env_of(KubeSettings, KUBE_PREFIX, kubeconfig=str(kubeconfig))}  # fmt: skip

    def mint(self, kubeconfig: Path, service: str, node: str = "") -> Path:
        """Write (again) the token of ``service`` on ``node`` (``""``: bound to no node, for a service
        that acts for none); its file. Blocking: call it in a thread."""
        token = mint_token(kubeconfig, f"gpushare-{service}", node=node, namespace=SERVICES_NAMESPACE,
                           audiences=[AUDIENCE], expiration_s=TOKEN_LIFETIME_S)  # fmt: skip
        path = self.directory / "tokens" / (f"{service}@{node}" if node else service)
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = path.with_suffix(".new")
        fresh.write_text(token.token)
        fresh.chmod(0o600)
        fresh.replace(path)  # a reader sees the old token or the new one, never half of one
        self.tokens[(service, node)] = path
        return path

    async def rotate(self, kubeconfig: Path, rotated: Callable[[], Awaitable[None]],
                     every_s: float = TOKEN_LIFETIME_S * REFRESH_AT) -> None:  # fmt: skip
        """Mint every token again before it expires, then ``rotated()`` (the leaf servers read theirs
        again), until cancelled."""
        while True:
            await asyncio.sleep(every_s)
            for service, node in list(self.tokens):
                with contextlib.suppress(Exception):  # a node gone meanwhile: its services are gone too
                    await asyncio.to_thread(self.mint, kubeconfig, service, node)
            await rotated()
