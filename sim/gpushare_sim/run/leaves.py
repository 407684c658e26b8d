"""Each simulated node's leaf server: the NATS its services use, as in Kubernetes.

A node's services connect only to their node's leaf (``nats-leaf@<node>``): the node's
stream and buckets live in the leaf's own JetStream domain (``Layout.node_domain``), and the
node's subjects (kmod commands, owner-backs, health) never leave it unless an observer in
the cluster listens. The node's part of the leaf's configuration is written by the command
the leaf's pod runs in Kubernetes (``gpushare-nats-leaf config``): its domain, its remotes to
every server of the cluster with the node's token (the ``leaf`` role through the auth
callout), and its local users, one per role, each allowed exactly
``Layout.permissions(role, node)`` with its password in a root-only file the service reads
(``GPUSHARE_NATS_PASSWORD_FILE``). Run again, it keeps the passwords and writes the remotes
with the token of the moment (the rotation).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gpushare_common.layout import Layout
from gpushare_common.settings import NATS_PREFIX, NatsSettings, env_of

from gpushare_sim import natsd

INSTALLER = "installer"


@dataclass
class NodeNats:
    """One node's leaf: its directory, its port, the settings a role connects with. The port is
    ``natsd.ANY_PORT`` until the leaf has reported the one it bound in ``ports_dir``; the
    launcher then sets it and writes the server's configuration again (:meth:`write_server`), so
    a restart takes it back."""

    node: str
    client_port: int
    state_dir: Path  # the store (data/), the users' passwords (users/), the node's part (conf/)
    hubs: tuple[str, ...]  # nats-leaf://host:port of every server of the cluster
    auth: bool = True  # False: an open leaf and cluster, for debugging
    ports_dir: Path | None = None  # where the leaf reports the ports it bound

    @classmethod
    def make(cls, node: str, client_port: int, directory: Path, hub_ports: tuple[int, ...],
             auth: bool, ports_dir: Path | None = None) -> NodeNats:  # fmt: skip
        hubs = tuple(f"nats-leaf://127.0.0.1:{port}" for port in hub_ports)
        return cls(node, client_port, directory / node, hubs, auth, ports_dir)

    @property
    def child(self) -> str:
        return f"nats-leaf@{self.node}"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"

    @property
    def domain(self) -> str:
        return Layout().node_domain(self.node)

    def write(self, token: str) -> Path:
        """The leaf's configuration with ``token`` (written again: the rotation); its path.
        Blocking: call it in a thread."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        token_file = self.state_dir / "token"
        token_file.write_text(token)
        argv = [sys.executable, "-m", "gpushare_nats_auth.leaf", "config", "--node", self.node, "--state-dir",
                str(self.state_dir), "--hub", ",".join(self.hubs), "--token-file", str(token_file),
                "--out-dir", str(self.state_dir / "conf"), *([] if self.auth else ["--open"])]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"gpushare-nats-leaf config for {self.node}: {done.stderr.strip()}")
        return self.write_server()

    def write_server(self) -> Path:
        """The leaf server's own configuration around the node's part (its port); its path."""
        config = self.state_dir / "leaf.conf"
        ports_dir = ""
        if self.ports_dir is not None:
            self.ports_dir.mkdir(parents=True, exist_ok=True)  # nats-server does not create it
            ports_dir = str(self.ports_dir)
        config.write_text(natsd.leaf_config(self.client_port, "conf", ports_dir=ports_dir))
        return config

    def password_file(self, role: str) -> str:
        """The file of ``role``'s password on this leaf ("" on an open leaf)."""
        return str(self.state_dir / "users" / role) if self.auth else ""

    def env(self, role: str) -> dict[str, str]:
        """The ``GPUSHARE_NATS_*`` variables of a node service of ``role``: its leaf, its user."""
        if not self.auth:
            return env_of(NatsSettings, NATS_PREFIX, url=self.url, stream_replicas=1, reconnect_wait_s=0.2)
        return env_of(NatsSettings, NATS_PREFIX, url=self.url, stream_replicas=1, reconnect_wait_s=0.2,
                      user=role, password_file=self.password_file(role))  # fmt: skip

    def settings(self, role: str = INSTALLER) -> NatsSettings:
        return NatsSettings(url=self.url, stream_replicas=1, reconnect_wait_s=0.2, user=role if self.auth else "",
                            password_file=self.password_file(role))  # fmt: skip
