"""Each simulated node's leaf server: the NATS its services use, as in Kubernetes.

A node's services connect only to their node's leaf (``nats-leaf@<node>``): the node's
stream and buckets live in the leaf's own JetStream domain (``Layout.node_domain``), and the
node's subjects (kmod commands, owner-backs, health) never leave it unless an observer in
the cluster listens. The leaf connects to every server of the cluster with its node's
identity (the ``leaf`` role: with the auth callout, a token bound to its Node); the node's
services authenticate to the leaf as the static users ``gpushare-nats-conf leaf-users``
makes on a Kubernetes node, each password in a root-only file the service reads
(``GPUSHARE_NATS_PASSWORD_FILE``), each user allowed exactly ``Layout.permissions(role, node)``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from gpushare_common.layout import Layout
from gpushare_common.settings import NATS_PREFIX, NatsSettings, env_of
from gpushare_nats_auth.natsconf import leaf_users

from gpushare_sim import natsd

INSTALLER = "installer"


@dataclass
class NodeNats:
    """One node's leaf: its server, its local users, the settings a role connects with."""

    node: str
    leaf: natsd.Leaf
    users: Path | None  # the directory of the users' passwords (None: an open leaf, for debugging)

    @classmethod
    def make(cls, node: str, client_port: int, store: Path, hub_ports: tuple[int, ...], auth: bool,
             layout: Layout | None = None) -> NodeNats:  # fmt: skip
        layout = layout or Layout()
        leaf = natsd.Leaf(f"nats-leaf-{node}", client_port, layout.node_domain(node), str(store / node / "data"),
                          hub_ports)  # fmt: skip
        return cls(node, leaf, store / node / "users" if auth else None)

    @property
    def child(self) -> str:
        return f"nats-leaf@{self.node}"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.leaf.client_port}"

    @property
    def domain(self) -> str:
        return self.leaf.domain

    def config(self, hub_token: str = "") -> str:
        """The leaf's configuration: its remotes (with the node's token), its local users.
        Blocking (the passwords' files are made at the first call): call it in a thread."""
        users = leaf_users(self.node, self.users) if self.users is not None else ""
        return natsd.leaf_config(replace(self.leaf, hub_token=hub_token), users)

    def password_file(self, role: str) -> str:
        """The file of ``role``'s password on this leaf ("" on an open leaf)."""
        return str(self.users / role) if self.users is not None else ""

    def env(self, role: str) -> dict[str, str]:
        """The ``GPUSHARE_NATS_*`` variables of a node service of ``role``: its leaf, its user."""
        if self.users is None:
            return env_of(NatsSettings, NATS_PREFIX, url=self.url, stream_replicas=1, reconnect_wait_s=0.2)
        return env_of(NatsSettings, NATS_PREFIX, url=self.url, stream_replicas=1, reconnect_wait_s=0.2,
                      user=role, password_file=self.password_file(role))  # fmt: skip

    def settings(self, role: str = INSTALLER) -> NatsSettings:
        return NatsSettings(url=self.url, stream_replicas=1, reconnect_wait_s=0.2, user=role if self.users else "",
                            password_file=self.password_file(role))  # fmt: skip
