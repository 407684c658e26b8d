"""``gpushare-nats-install``: create or update the event stream and every key-value bucket.

The installer's job (on each node, beside its leaf server: ``--node``; a one-shot compose
container; the local cluster's start): no service may create, update or delete a stream or
a bucket. With ``--node`` the stream records only that node's subjects (its leaf's own
JetStream domain); without, every node's (one server for everything). Settings are the
services' ``GPUSHARE_NATS_*`` (the server, the installer's credentials,
``GPUSHARE_NATS_STREAM_REPLICAS``). It waits for a server to answer and for JetStream to
accept the layout (a cluster electing its leader), up to ``--timeout`` seconds; exit 0 when
done, 1 when it could not.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from ..logging import get_logger, setup
from ..retry import Backoff, Stopped, retry
from ..settings import NATS_PREFIX, NatsSettings, SettingsError, load
from . import Bus, BusError, Transient

log = get_logger("install")


async def install(settings: NatsSettings, deadline_s: float, node: str = "") -> None:
    """Connect as the installer and create or update the layout (of ``node`` on its leaf, or of
    every node); :class:`Stopped` at the deadline."""
    bus = Bus(settings, "installer")
    stop = asyncio.Event()
    timer = asyncio.get_running_loop().call_later(deadline_s, stop.set)
    try:
        await bus.connect(stop)
        await retry(lambda: bus.ensure_layout(node), (Transient,), "create the stream and buckets", stop,
                    Backoff(0.1, 2.0), node=node or "every node")  # fmt: skip
    finally:
        timer.cancel()
        await bus.drain()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpushare-nats-install", description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for NATS (default 300)")
    parser.add_argument("--node", default="", help="the node whose leaf server this is (default: every node)")
    args = parser.parse_args(argv)
    setup("INFO")
    try:
        settings = load(NatsSettings, NATS_PREFIX)
    except SettingsError as err:
        print(f"gpushare-nats-install: {err}", file=sys.stderr)
        return 2
    try:
        asyncio.run(install(settings, args.timeout, args.node))
    except (Stopped, BusError, ValueError) as err:  # ValueError: a node name that is no subject token
        print(f"gpushare-nats-install: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
