"""API emulator at cluster scale, with the official client.

  python -m bench.apiserver [--pods 10000] [--nodes 100] [--patches 2000]
"""

from __future__ import annotations

import argparse

from gpushare_sim.apiserver.bench import run

from bench.report import Row, emit

TARGETS = {"list one node's pods (fieldSelector), median": ("< 100 ms", lambda v: v < 100)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--patches", type=int, default=2_000)
    args = parser.parse_args()
    rows = []
    for metric, value, unit in run(args.pods, args.nodes, args.patches):
        target, check = TARGETS.get(metric, ("", None))
        rows.append(Row("sim/apiserver", metric, value, unit, target, None if check is None else check(value)))
    emit(rows)


if __name__ == "__main__":
    main()
