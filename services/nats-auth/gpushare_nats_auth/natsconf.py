"""``gpushare-nats-conf``: the parts of a nats-server configuration that come from gpushare's code.

- ``issuer --secret FILE``: ``AUTH_ISSUER: "A…"``, the public key of the issuer
  secret the auth callout signs with, for a configuration that says
  ``auth_callout { issuer: $AUTH_ISSUER }`` (a Kubernetes init container
  writes it beside the server's configuration).
- ``static-users --node NODE``: an ``authorization`` block with one user per role
  compose runs, each allowed exactly ``Layout.permissions(role, NODE)``, passwords
  from ``$<ROLE>_PASSWORD`` (one node without the callout: docker compose).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpushare_common.layout import NODE_ROLES, Layout

from .issuer import load_issuer

# compose runs the device plugins, never the DRA driver (Kubernetes only): no user for that role
STATIC_ROLES = (*(r for r in NODE_ROLES if r != "dra-driver"), "observer", "installer")


def password_variable(role: str) -> str:
    return f"{role.replace('-', '_').upper()}_PASSWORD"


def issuer_conf(secret_file: str) -> str:
    return f'AUTH_ISSUER: "{load_issuer(secret_file).public}"\n'


def static_users(node: str, layout: Layout | None = None) -> str:
    """The authorization block of the static users of one node (``$<ROLE>_PASSWORD`` each)."""
    layout = layout or Layout()
    lines = ["# Rendered by gpushare-nats-conf static-users from gpushare_common.layout: do not edit.",
             f"# Node {node}: each role may do exactly its own work on this node (Layout.permissions).",
             "authorization {", "  users: ["]  # fmt: skip
    for role in STATIC_ROLES:
        permissions = json.dumps(layout.permissions(role, node if role in NODE_ROLES else "").as_config())
        lines.append(f'    {{user: "{role}", password: ${password_variable(role)}, permissions: {permissions}}}')
    return "\n".join([*lines, "  ]", "}"]) + "\n"


def _write(text: str, out: str) -> None:
    if out == "-":
        sys.stdout.write(text)
    else:
        Path(out).write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpushare-nats-conf", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    issuer = commands.add_parser("issuer", help="AUTH_ISSUER from the issuer secret")
    issuer.add_argument("--secret", required=True, help="the issuer secret file (SA… seed or random text)")
    users = commands.add_parser("static-users", help="one static user per role for one node")
    users.add_argument("--node", required=True)
    for sub in (issuer, users):
        sub.add_argument("--out", default="-", help="file to write (default: standard output)")
    args = parser.parse_args(argv)
    try:
        text = issuer_conf(args.secret) if args.command == "issuer" else static_users(args.node)
    except ValueError as err:  # SettingsError (a bad secret file), LayoutError (a bad node name)
        print(f"gpushare-nats-conf: {err}", file=sys.stderr)
        return 2
    _write(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
