"""Every benchmark runs end to end at a tiny size (so none of them rots unnoticed as the
services change) and its table has the figures it promises. Targets are not judged here:
these runs are too small and this machine too noisy; ``make bench`` judges them. Not here:
``bench.kmod`` (a minute in its VM; the module's own VM tests boot the same one) and
``bench.fleet`` (tests/bench/test_fleet.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpushare_sim.containerd import missing_binaries

REPO = Path(__file__).resolve().parents[2]

# part, tiny arguments, a metric its rows must include, needs root and containerd
TINY: list[tuple[str, list[str], str, bool]] = [
    ("bus", ["--messages", "2000", "--js-messages", "500", "--requests", "50", "--rounds", "1"],
     "core typed/raw", False),
    ("detector", ["--pods", "50", "--changes", "10", "--rounds", "1"],
     "pod change -> event published p99 (in detector)", False),
    ("deviceplugin", ["--toggles", "5", "--allocations", "10"], "Allocate share p99 (n=10)", False),
    ("dra", ["--claims", "90", "--toggles", "5", "--placement", "any"],
     "NodePrepareResources, a claim of one shared device p99 (n=40), any", False),
    ("shadow_controller", ["--pods", "500", "--shadows", "50", "--passes", "2"],
     "reconcile pass, 500 pods / 50 ShadowPods", False),
    ("apiserver", ["--pods", "50", "--nodes", "2", "--patches", "10"], "patch latency during fan-out, p99", False),
    ("nats_auth", ["--rounds", "10"], "connect token via callout + TokenReview p99", False),
    ("kmod_bridge", ["--rounds", "10"], "notice->delivered p99 (sim, host)", False),
    ("runtime", ["--cycles", "3", "--siblings", "2"], "same-pod: overhead median", True),
    ("solver", ["--trials", "3", "--chain", "3"], "owner back -> release sent p99 (n=3)", True),
    ("simnode", ["--pods", "2", "--allocations", "5"], "pod start (containerd CRI) p50", True),
    ("e2e", ["--trials", "2", "--quiet"], "owner-back ioctl -> owner's call returns p99", True),
]


@pytest.mark.slow
@pytest.mark.parametrize(("part", "args", "metric", "root"), TINY, ids=[t[0] for t in TINY])
def test_the_benchmark_runs_and_prints_its_figures(part: str, args: list[str], metric: str, root: bool,
                                                   tmp_path: Path) -> None:
    if root and (missing_binaries() or os.geteuid() != 0):
        pytest.skip(f"bench.{part} needs root and {', '.join(missing_binaries()) or 'containerd'}")
    results = tmp_path / "results.json"
    run = subprocess.run([sys.executable, "-m", f"bench.{part}", *args], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "GPUSHARE_BENCH_RESULTS": str(results)}, timeout=400)
    assert run.returncode == 0, f"bench.{part} failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    rows = json.loads(results.read_text())["rows"]
    metrics = {r["metric"] for r in rows}
    assert any(metric in m for m in metrics), f"no {metric!r} among {sorted(metrics)}"
    assert all(r["value"] == r["value"] for r in rows), "a figure is NaN (no samples)"  # NaN != NaN
    assert all(r["commit"] for r in rows), "a figure without the commit it measured"
    assert "measured " in run.stdout and ", commit " in run.stdout  # printed under the table
