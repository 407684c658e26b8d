"""``python -m bench.fleet`` runs end to end at a tiny size (so it keeps working) and its table
has the figures the benchmark promises, in their units: with the shipped layout (a leaf server
per node), the cluster holds nothing of any node."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from gpushare_sim import natsd
from gpushare_sim.containerd import missing_binaries

pytestmark = [pytest.mark.containerd, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TINY = ["--nodes", "5", "--steps", "2,5", "--window", "2", "--settle", "0.5", "--trials", "2", "--rounds", "1",
        "--kills", "1", "--down", "1"]  # fmt: skip


def test_monitoring_port_is_written_only_when_asked() -> None:
    member = natsd.Member("n1", 4222, store_dir="/tmp/s")
    assert "http" not in natsd.server_config(member)
    assert 'http: "127.0.0.1:8222"' in natsd.server_config(natsd.Member("n1", 4222, monitor_port=8222))


@pytest.fixture
def results(tmp_path: Path) -> dict[str, dict[str, object]]:
    missing = missing_binaries()
    if missing or os.geteuid() != 0:
        pytest.skip(f"the real node needs root and {', '.join(missing) or 'containerd'}")
    path = tmp_path / "results.json"
    run = subprocess.run([sys.executable, "-m", "bench.fleet", *TINY, "--results", str(path)], cwd=REPO,
                         capture_output=True, text=True, timeout=280)  # fmt: skip
    print(run.stdout[-6000:])  # shown on a failure: the trials' reasons, the table
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "part   metric" in run.stdout and "fleet  5 nodes: servers' CPU (3 servers)" in run.stdout
    return {r["metric"]: r for r in json.loads(path.read_text())["rows"]}


def test_tiny_fleet_prints_every_figure(results: dict[str, dict[str, object]]) -> None:
    for size in (2, 5):
        assert results[f"{size} nodes: servers' CPU (3 servers)"]["unit"] == "cores"
        assert results[f"{size} nodes: servers' RSS per 100 nodes"]["unit"] == "MB"
        assert results[f"{size} nodes: streams added per node"]["value"] == 0
        assert results[f"{size} nodes: consumers per node"]["value"] == 0  # the solver's is on its node's leaf
        assert results[f"{size} nodes: raft groups per node"]["value"] == 0
        assert results[f"{size} nodes: with their durable consumer"]["ok"] is True
        assert results[f"{size} nodes: leaf servers' RSS per node"]["unit"] == "MB"
    assert float(results["5 nodes: fetches per node achieved"]["value"]) > 0.5  # type: ignore[arg-type]
    assert results["5 nodes: emulator was the bottleneck (a worker at >= 0.8 core; 1 = yes)"]["value"] == 0
    # n: the trials that completed. On a loaded machine a phase's two trials may both fail (their
    # reasons are in the benchmark's output); every phase failing is a broken owner-back path.
    completed = []
    for phase in ("before any fleet", "5 nodes paused", "5 nodes running"):
        held = [r for m, r in results.items() if re.fullmatch(rf"owner-back held, {phase} p99 \(n=[12]\)", m)]
        for row in held:
            assert 0 < float(row["value"]) < 3000, row  # type: ignore[arg-type]
        completed += held
    assert completed, "no owner-back trial completed in any phase"
    ratio = results["owner-back p99, 5 nodes running / paused (same run, alternating)"]
    assert ratio["target"] == "<= 2" and ratio["unit"] == "x"
    assert results["fleet connections up after the failovers"]["ok"] is True
    assert any(metric.startswith("owner-back held, owner's call right after the stream leader was SIGKILLed")
               for metric in results)
