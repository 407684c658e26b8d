"""The soak's progress lines and its closing table."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

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
    rows = [("run", args.label or "(custom)"), ("date", time.strftime("%Y-%m-%d %H:%M %Z")),
            ("commit", commit()), ("load average at the end (1/5/15 min)", _load()),
            ("seed", str(args.seed)), ("minutes", f"{args.minutes:g}"), ("nodes", str(args.nodes)),
            ("NATS servers (and one leaf server per node)", str(args.nats_cluster)),
            ("faults", f"{','.join(args.faults) or 'none'} (every {args.fault_every:g} s, {args.fault_schedule})"),
            ("borrowers slow to die (share, MiB)", f"{args.slow_share:g}, {args.borrower_mib}")]  # fmt: skip
    rows += [(what, str(count)) for what, count in sorted(f.counts.items())]
    rows += [("guarded owner-backs", str(run.checks.owner_backs))]
    rows += [("owner's GPU call held by the kernel (ms) p50/p99", _pair(f.owner_back_ms)),
             ("owner-back taken -> borrower's tasks dead (ms) p50/p99", _pair(f.evicted_ms))]  # fmt: skip
    for kind, values in sorted(f.recovery_s.items()):
        rows.append((f"{kind}: fault -> every service ready (s) p50/p99", _pair(values, 2)))
    checked = [i for i in (*INVARIANTS, "soak") if i != "released" or run.checks.expect_release]
    by = {i: sum(v.invariant == i for v in run.checks.violations) for i in checked}
    rows += [(f"violations: {i}", str(n)) for i, n in by.items()]
    width = max(len(r[0]) for r in rows)
    return "\n".join(["", "soak results", "-" * (width + 14), *(f"{k:<{width}}  {v}" for k, v in rows)])


def commit() -> str:
    """The checked-out commit (``+dirty`` with uncommitted changes); ``unknown`` outside git."""
    root = Path(__file__).resolve().parents[3]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}+dirty" if dirty else head


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg()) + f" on {os.cpu_count()} cores"


def _pair(values: list[float], digits: int = 1) -> str:
    if not values:
        return "-"
    return f"{percentile(values, 50):.{digits}f} / {percentile(values, 99):.{digits}f}  (n={len(values)}, " \
           f"mean {statistics.fmean(values):.{digits}f})"
