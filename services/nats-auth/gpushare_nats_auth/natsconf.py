"""``gpushare-nats-conf``: the parts of a nats-server configuration that come from gpushare's code.

- ``issuer --secret FILE``: ``AUTH_ISSUER: "A…"``, the public key of the issuer
  secret the auth callout signs with, for a configuration that says
  ``auth_callout { issuer: $AUTH_ISSUER }`` (a Kubernetes init container
  writes it beside the server's configuration).
- ``static-users --node NODE``: an ``authorization`` block with one user per role
  compose runs, each allowed exactly ``Layout.permissions(role, NODE)``, passwords
  from ``$<ROLE>_PASSWORD`` (one node without the callout: docker compose).
- ``leaf-users --node NODE --dir DIR``: the users of a node's leaf server, one per node
  service role and the installer, each allowed exactly ``Layout.permissions(role, NODE)``;
  each password is ``DIR/<role>`` (made once with 32 random hex digits, mode 0600, kept
  across restarts so connected services keep working), read by the service whose pod mounts
  that one file (``GPUSHARE_NATS_PASSWORD_FILE``). The block goes to ``DIR/users.conf``
  (mode 0600) unless ``--out`` says otherwise. Nothing of the cluster or the API server is
  needed to connect to a leaf.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from collections.abc import Mapping
from pathlib import Path

from gpushare_common.layout import NODE_ROLES, SERVICE_ROLES, Layout

from .issuer import load_issuer

# compose runs the device plugins, never the DRA driver (Kubernetes only): no user for that role
STATIC_ROLES = (*(r for r in SERVICE_ROLES if r != "dra-driver"), "observer", "installer")
LEAF_ROLES = (*SERVICE_ROLES, "installer")  # the users of a node's leaf server


def password_variable(role: str) -> str:
    return f"{role.replace('-', '_').upper()}_PASSWORD"


def issuer_conf(secret_file: str) -> str:
    return f'AUTH_ISSUER: "{load_issuer(secret_file).public}"\n'


def _users_block(command: str, node: str, passwords: Mapping[str, str], layout: Layout | None) -> str:
    """An authorization block: each role's user with its password (text as the config writes it)
    and ``Layout.permissions(role, node)``."""
    layout = layout or Layout()
    lines = [f"# Rendered by gpushare-nats-conf {command} from gpushare_common.layout: do not edit.",
             f"# Node {node}: each role may do exactly its own work on this node (Layout.permissions).",
             "authorization {", "  users: ["]  # fmt: skip
    for role, password in passwords.items():
        permissions = json.dumps(layout.permissions(role, node if role in NODE_ROLES else "").as_config())
        lines.append(f'    {{user: "{role}", password: {password}, permissions: {permissions}}}')
    return "\n".join([*lines, "  ]", "}"]) + "\n"


def static_users(node: str, layout: Layout | None = None) -> str:
    """The authorization block of the static users of one node (``$<ROLE>_PASSWORD`` each)."""
    passwords: dict[str, str] = {role: f"${password_variable(role)}" for role in STATIC_ROLES}
    return _users_block("static-users", node, passwords, layout)


def leaf_password(directory: Path, role: str) -> str:
    """The password of ``role`` on this node's leaf: ``directory/<role>``, made once (mode 0600)."""
    path = directory / role
    if not path.exists():
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fresh = path.with_suffix(".new")
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(secrets.token_hex(16))
        fresh.replace(path)  # a reader sees no password or the whole one
    password = path.read_text(encoding="utf-8").strip()
    if not password:
        raise ValueError(f"{path} is empty: remove it and run leaf-users again to make a new password")
    return password


def leaf_users(node: str, directory: Path, layout: Layout | None = None) -> str:
    """The authorization block of a node's leaf server (passwords in ``directory``)."""
    passwords: dict[str, str] = {role: json.dumps(leaf_password(directory, role)) for role in LEAF_ROLES}
    return _users_block("leaf-users", node, passwords, layout)


def _write(text: str, out: str, private: bool) -> None:
    if out == "-":
        sys.stdout.write(text)
    elif not private:
        Path(out).write_text(text, encoding="utf-8")
    else:  # it holds passwords
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpushare-nats-conf", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    issuer = commands.add_parser("issuer", help="AUTH_ISSUER from the issuer secret")
    issuer.add_argument("--secret", required=True, help="the issuer secret file (SA… seed or random text)")
    users = commands.add_parser("static-users", help="one static user per role for one node")
    users.add_argument("--node", required=True)
    leaf = commands.add_parser("leaf-users", help="the users of one node's leaf server, passwords in --dir")
    leaf.add_argument("--node", required=True)
    leaf.add_argument("--dir", required=True, type=Path, help="the leaf's root-only state directory")
    for sub in (issuer, users, leaf):
        sub.add_argument("--out", default="-" if sub is not leaf else "", help="file to write (default: "
                         "standard output; leaf-users: DIR/users.conf)")
    args = parser.parse_args(argv)
    try:
        text = issuer_conf(args.secret) if args.command == "issuer" else static_users(args.node) \
            if args.command == "static-users" else leaf_users(args.node, args.dir)
    except (ValueError, OSError) as err:  # SettingsError, LayoutError (a bad node name), an unwritable --dir
        print(f"gpushare-nats-conf: {err}", file=sys.stderr)
        return 2
    _write(text, args.out or str(args.dir / "users.conf"), args.command == "leaf-users")
    return 0


if __name__ == "__main__":
    sys.exit(main())
