"""`python -m gpushare_sim.apiserver --port P --kubeconfig FILE`: serve until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from gpushare_common.logging import get_logger, setup
from gpushare_common.ports import BindError, remove_ports, write_ports

from .app import ApiSettings
from .server import ApiServer, ServerSettings, write_kubeconfig

log = get_logger("apiserver")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpushare_sim.apiserver", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (see --ports-dir)")
    parser.add_argument("--ports-dir", type=Path, help="report the bound port in a ports file here")
    parser.add_argument("--kubeconfig", type=Path, help="write a kubeconfig for the server here")
    parser.add_argument("--history", type=int, default=10_000, help="changes kept for watches")
    parser.add_argument("--watch-queue", type=int, default=100_000, help="events per slow watcher")
    parser.add_argument("--bookmark-interval", type=float, default=1.0, help="seconds")
    parser.add_argument("--state-file", type=Path, help="keep the objects here across a restart")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup("INFO")
    api = ApiSettings(args.history, args.watch_queue, args.bookmark_interval)
    try:
        server = ApiServer(ServerSettings(args.host, args.port, api), args.state_file)
    except BindError as err:
        print(f"gpushare-sim-apiserver: {err}", file=sys.stderr)
        return 1
    if args.kubeconfig is not None:
        write_kubeconfig(args.kubeconfig, server.url)
    if args.ports_dir is not None:
        write_ports(args.ports_dir, "apiserver", {"api": [server.url]})
    log.info("serving", url=server.url, kubeconfig=args.kubeconfig, restored=server.restored)
    try:
        asyncio.run(server.serve())
    finally:
        if args.ports_dir is not None:
            remove_ports(args.ports_dir, "apiserver")
    log.info("stopped", url=server.url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
