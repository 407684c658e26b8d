"""The soak's progress lines and its closing table."""

from __future__ import annotations

import argparse
import statistics
import time

from gpushare_sim.soak.actors import Soak
from gpushare_sim.soak.checks import INVARIANTS


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def progress(run: Soak) -> str:
    left = max(0.0, run.deadline - time.monotonic())
    counts = ", ".join(f"{k} {v}" for k, v in sorted(run.figures.counts.items()))
    return f"soak: {left:5.0f}s left; {counts or 'starting'}; violations {len(run.checks.violations)}"


def table(args: argparse.Namespace, run: Soak) -> str:
    f = run.figures
    rows = [("seed", str(args.seed)), ("minutes", f"{args.minutes:g}"), ("nodes", str(args.nodes)),
            ("NATS servers", str(args.nats_cluster))]  # fmt: skip
    rows += [(what, str(count)) for what, count in sorted(f.counts.items())]
    rows += [("guarded owner-backs", str(run.checks.owner_backs))]
    rows += [("owner's GPU call held by the kernel (ms) p50/p99", _pair(f.owner_back_ms)),
             ("owner-back taken -> borrower's tasks dead (ms) p50/p99", _pair(f.evicted_ms))]  # fmt: skip
    for kind, values in sorted(f.recovery_s.items()):
        rows.append((f"{kind}: fault -> every service ready (s) p50/p99", _pair(values, 2)))
    by = {i: sum(v.invariant == i for v in run.checks.violations) for i in (*INVARIANTS, "soak")}
    rows += [(f"violations: {i}", str(n)) for i, n in by.items()]
    width = max(len(r[0]) for r in rows)
    return "\n".join(["", "soak results", "-" * (width + 14), *(f"{k:<{width}}  {v}" for k, v in rows)])


def _pair(values: list[float], digits: int = 1) -> str:
    if not values:
        return "-"
    return f"{percentile(values, 50):.{digits}f} / {percentile(values, 99):.{digits}f}  (n={len(values)}, " \
           f"mean {statistics.fmean(values):.{digits}f})"
