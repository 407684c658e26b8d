"""The benchmark runs end to end at a small size (so it keeps working)."""

from __future__ import annotations

from gpushare_sim.apiserver.bench import run


def test_benchmark_runs_small() -> None:
    figures = run(pods=40, nodes=4, patches=20)
    units = {metric: unit for metric, _value, unit in figures}
    assert units["create pods (4 client threads)"] == "pods/s"
    assert all(value > 0 for _metric, value, _unit in figures)
