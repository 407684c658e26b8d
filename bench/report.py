"""Benchmark results: one row per figure, printed as a table and merged into bench/results.json."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

RESULTS = Path(__file__).with_name("results.json")


@dataclass(frozen=True, slots=True)
class Row:
    part: str
    metric: str
    value: float
    unit: str
    target: str = ""
    ok: bool | None = None  # None: informational

    @property
    def verdict(self) -> str:
        return "" if self.ok is None else ("ok" if self.ok else "MISSED")


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(samples: list[float]) -> float:
    return statistics.median(samples) if samples else float("nan")


def table(rows: list[Row]) -> str:
    header = ("part", "metric", "value", "unit", "target", "")
    body = [(r.part, r.metric, f"{r.value:,.3f}".rstrip("0").rstrip("."), r.unit, r.target, r.verdict)
            for r in rows]
    widths = [max(len(str(line[i])) for line in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
             for line in [header, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def commit() -> str:
    """The commit measured (``git describe --always --dirty``), "" outside a git checkout."""
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=RESULTS.parent, capture_output=True,
                              text=True, timeout=10, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


def stamp(at: float | None = None) -> str:
    """When and on which commit figures were measured: what each printed figure carries."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(time.time() if at is None else at))
    return f"measured {when}, commit {commit() or 'unknown'}, on {platform.node()} (load {os.getloadavg()[0]:.1f})"


def save(rows: list[Row], path: Path | None = None) -> None:
    """Merge rows into the JSON file (keyed by part and metric), keeping other parts' figures;
    ``GPUSHARE_BENCH_RESULTS`` names another file."""
    path = path or Path(os.environ.get("GPUSHARE_BENCH_RESULTS") or RESULTS)
    doc = json.loads(path.read_text()) if path.exists() else {"rows": []}
    keep = [r for r in doc.get("rows", []) if (r["part"], r["metric"]) not in
            {(x.part, x.metric) for x in rows}]
    doc = {"machine": platform.node(), "python": platform.python_version(),
           "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "rows": keep + [{**asdict(r), "at": time.time(), "commit": commit()} for r in rows]}
    path.write_text(json.dumps(doc, indent=2) + "\n")


def emit(rows: list[Row]) -> None:
    print(table(rows), flush=True)
    print(stamp(), flush=True)
    save(rows)
