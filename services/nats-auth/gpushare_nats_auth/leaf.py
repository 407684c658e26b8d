"""``gpushare-nats-leaf``: what a node's leaf server needs beside it (the other containers of its pod).

  gpushare-nats-leaf config --node N --state-dir D --hub URL[,URL...] --token-file F --out-dir C
      the node's part of the leaf's configuration, before the server starts: ``C/node.conf``
      (its name, its JetStream domain ``Layout.node_domain(N)`` and store ``D/data``, its
      local users: one per node service role and the installer, passwords made once in
      ``D/users``, see ``gpushare-nats-conf leaf-users``) and ``C/remote.conf`` (its
      connection to every server of the cluster, with the node's service-account token).
  gpushare-nats-leaf agent (the same options) --pid-file P
      beside the running server: creates the node's stream and buckets on it (as its
      installer), then keeps ``C/remote.conf`` current: when the kubelet rotates the token
      file, the file is written again and the server (the pid in ``P``) told to reload it.

The token authenticates the leaf to the cluster through the auth callout (role ``leaf``, its
node only); the node's services need neither the cluster nor the API server to connect.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from gpushare_common.bus import BusError
from gpushare_common.bus.install import install
from gpushare_common.layout import Layout
from gpushare_common.logging import get_logger, setup
from gpushare_common.retry import Stopped
from gpushare_common.settings import NatsSettings

from .natsconf import leaf_users

log = get_logger("nats-leaf")
INSTALLER = "installer"


@dataclass(frozen=True, slots=True)
class LeafFiles:
    node: str
    state_dir: Path
    hubs: tuple[str, ...]  # nats-leaf://host:port of every server of the cluster
    token_file: Path
    out_dir: Path
    local_users: bool = True  # False: an open leaf (the local cluster's debugging mode only)

    def node_conf(self, layout: Layout) -> str:
        domain = layout.node_domain(self.node)
        users = leaf_users(self.node, self.state_dir / "users", layout) if self.local_users else ""
        return (f'server_name: "{domain}"\n'
                f'jetstream {{ store_dir: "{self.state_dir / "data"}", domain: "{domain}" }}\n' + users)  # fmt: skip

    def remote_conf(self, token: str) -> str:
        auth = f"{token}@" if token else ""
        urls = ", ".join(f'"{url.replace("://", f"://{auth}", 1)}"' for url in self.hubs)
        return f"leafnodes {{ reconnect: \"1s\", remotes: [ {{ urls: [{urls}] }} ] }}\n"

    def token(self) -> str:
        try:
            return self.token_file.read_text(encoding="utf-8").strip()
        except OSError as err:
            log.error("cannot read the leaf's token; the cluster will refuse it", path=str(self.token_file),
                      error=str(err))  # fmt: skip
            return ""

    def write(self, layout: Layout) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        _private(self.out_dir / "node.conf", self.node_conf(layout))
        self.write_remote(self.token())

    def write_remote(self, token: str) -> None:
        _private(self.out_dir / "remote.conf", self.remote_conf(token))


def _private(path: Path, text: str) -> None:
    fresh = path.with_suffix(".new")
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    fresh.replace(path)


async def agent(files: LeafFiles, url: str, pid_file: Path, every_s: float = 10.0) -> None:
    """Install the node's layout on its leaf, then follow the token's rotation until cancelled."""
    settings = NatsSettings(url=url, user=INSTALLER, password_file=str(files.state_dir / "users" / INSTALLER))
    await install(settings, deadline_s=600, node=files.node)
    log.info("node's stream and buckets ready on its leaf", node=files.node)
    current = files.token()
    while True:
        await asyncio.sleep(every_s)
        token = files.token()
        if token and token != current:
            files.write_remote(token)
            _reload(pid_file)
            current = token
            log.info("leaf's token rotated; server reloaded", node=files.node)


def _reload(pid_file: Path) -> None:
    try:
        os.kill(int(pid_file.read_text().strip()), signal.SIGHUP)
    except (OSError, ValueError) as err:
        log.error("cannot tell the leaf server to reload", pid_file=str(pid_file), error=str(err))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpushare-nats-leaf", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("config", "agent"))
    parser.add_argument("--node", required=True)
    parser.add_argument("--state-dir", required=True, type=Path, help="the leaf's root-only state on the node")
    parser.add_argument("--hub", required=True, help="nats-leaf://host:port of each server, comma-separated")
    parser.add_argument("--token-file", required=True, type=Path, help="the leaf pod's projected token")
    parser.add_argument("--out-dir", required=True, type=Path, help="where node.conf and remote.conf go")
    parser.add_argument("--url", default="nats://127.0.0.1:4224", help="agent: the leaf server's client URL")
    parser.add_argument("--pid-file", type=Path, default=Path("/var/run/nats-leaf/nats.pid"))
    parser.add_argument("--open", action="store_true", help="no local users (a local cluster's debugging only)")
    args = parser.parse_args(argv)
    setup("INFO")
    hubs = tuple(u.strip() for u in args.hub.split(",") if u.strip())
    files = LeafFiles(args.node, args.state_dir, hubs, args.token_file, args.out_dir, not args.open)
    try:
        if args.command == "config":
            files.write(Layout())
        else:
            asyncio.run(agent(files, args.url, args.pid_file))
    except (ValueError, OSError, Stopped, BusError) as err:  # a bad node name, an unwritable dir, no leaf
        print(f"gpushare-nats-leaf: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
