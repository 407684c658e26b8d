"""Each simulated node's leaf server: the NATS its services use, as in Kubernetes.

A node's services connect only to their node's leaf (``nats-leaf@<node>``): the node's
stream and buckets live in the leaf's own JetStream domain (``Layout.node_domain``), and the
node's subjects (kmod commands, owner-backs, health) never leave it unless an observer in
the cluster listens. The node's part of the leaf's configuration is written by the code the
leaf's pod runs in Kubernetes (``gpushare-nats-leaf``): its domain, its remotes to every
server of the cluster with the node's token (the ``leaf`` role through the auth callout), and
its local users, one per role, each allowed exactly ``Layout.permissions(role, node)`` with
its password in a root-only file the service reads (``GPUSHARE_NATS_PASSWORD_FILE``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpushare_common.layout import Layout
from gpushare_common.settings import NATS_PREFIX, NatsSettings, env_of
from gpushare_nats_auth.leaf import INSTALLER, LeafFiles

from gpushare_sim import natsd


@dataclass
class NodeNats:
    """One node's leaf: its files, its port, the settings a role connects with."""

    files: LeafFiles
    client_port: int
    auth: bool = True  # False: an open leaf and cluster, for debugging

    @classmethod
    def make(cls, node: str, client_port: int, directory: Path, hub_ports: tuple[int, ...],
             auth: bool) -> NodeNats:  # fmt: skip
        hubs = tuple(f"nats-leaf://127.0.0.1:{port}" for port in hub_ports)
        files = LeafFiles(node, directory / node, hubs, directory / node / "token", directory / node / "conf", auth)
        return cls(files, client_port, auth)

    @property
    def node(self) -> str:
        return self.files.node

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
        """The leaf's configuration with ``token``; its path. Blocking (the users' passwords are
        made at the first call): call it in a thread."""
        self.files.token_file.parent.mkdir(parents=True, exist_ok=True)
        self.files.token_file.write_text(token)
        self.files.write(Layout())
        config = self.files.state_dir / "leaf.conf"
        config.write_text(natsd.leaf_config(self.client_port, self.files.out_dir.name))
        return config

    def password_file(self, role: str) -> str:
        """The file of ``role``'s password on this leaf ("" on an open leaf)."""
        return str(self.files.state_dir / "users" / role) if self.auth else ""

    def env(self, role: str) -> dict[str, str]:
        """The ``GPUSHARE_NATS_*`` variables of a node service of ``role``: its leaf, its user."""
        if not self.auth:
            return env_of(NatsSettings, NATS_PREFIX, url=self.url, stream_replicas=1, reconnect_wait_s=0.2)
        return env_of(NatsSettings, NATS_PREFIX, url=self.url, stream_replicas=1, reconnect_wait_s=0.2,
                      user=role, password_file=self.password_file(role))  # fmt: skip

    def settings(self, role: str = INSTALLER) -> NatsSettings:
        return NatsSettings(url=self.url, stream_replicas=1, reconnect_wait_s=0.2, user=role if self.auth else "",
                            password_file=self.password_file(role))  # fmt: skip
