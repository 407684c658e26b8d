"""``python -m bench.nats_auth``: how long a connection takes to be authorised.

Connect (CONNECT to the first PONG) and close, ``--rounds`` times each, on nats-server 2.15.1
with the shipped configurations (tests/deploy/nats_deployments.py): a static user with a
password (compose), a node service's static user on its node's leaf server (the chart's node
services), a static user beside the auth callout (the chart's installer: the callout is not
asked), and a service-account token through the auth callout (the chart's observer and leaf
servers: the server asks the callout, which asks the API emulator for a TokenReview and signs a
user).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import nats

from bench.report import Row, percentile, save, stamp, table
from tests.deploy.nats_deployments import NODE_A, Deployment, chart_nats, compose_nats

PART = "nats_auth"


async def connect_times(deployment: Deployment, role: str, rounds: int) -> list[float]:
    url, credentials = deployment.url(role, NODE_A), deployment.credentials(role, NODE_A)
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        nc = await nats.connect(url, max_reconnect_attempts=0, **credentials)
        samples.append((time.perf_counter() - started) * 1000)
        await nc.close()
    return samples


def rows(name: str, samples: list[float], target: str = "", limit: float | None = None) -> list[Row]:
    p99 = percentile(samples, 99)
    return [Row(PART, f"connect {name} p50", percentile(samples, 50), "ms"),
            Row(PART, f"connect {name} p99", p99, "ms", target, None if limit is None else p99 <= limit)]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.nats_auth", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    found: list[Row] = []
    with compose_nats() as compose:
        found += rows("static user (compose)", asyncio.run(connect_times(compose, "solver", args.rounds)))
    with chart_nats() as chart:
        found += rows("node service on its leaf", asyncio.run(connect_times(chart, "solver", args.rounds)))
        found += rows("static user beside the callout", asyncio.run(connect_times(chart, "installer", args.rounds)))
        # below the server's authorization timeout (2 s), with room to spare
        found += rows("token via callout + TokenReview", asyncio.run(connect_times(
            chart, "observer", args.rounds)), "<= 500 ms", 500.0)
    save(found)
    print(table(found))
    print(stamp())
    return 0 if all(r.ok is not False for r in found) else 1


if __name__ == "__main__":
    raise SystemExit(main())
