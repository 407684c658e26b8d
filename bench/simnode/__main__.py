"""Node simulator: allocation, health propagation, exporter scrape, pod start/stop.

  python -m bench.simnode
"""

from __future__ import annotations

import argparse
import asyncio

from gpushare_sim.node.bench import run

from bench.report import Row, emit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--allocations", type=int, default=500)
    parser.add_argument("--no-containerd", action="store_true")
    figures = asyncio.run(run(parser.parse_args()))
    emit([Row("simnode", f["metric"], f["value"], f["unit"], f.get("target", "")) for f in figures])


if __name__ == "__main__":
    main()
