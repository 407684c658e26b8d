"""The console story of a run: one narrated line per step, hops with their
latency, and a summary table at the end.

``Timeline.step("nats-server up", url=...)`` prints ``[  1.234s] nats-server up url=...``;
``Timeline.hop(scenario, "owner ioctl -> borrowers dead", seconds)`` records one
measured hop (printed too); ``Timeline.result(scenario, ok, detail)`` closes a
scenario. ``summary()`` renders what happened as a table.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TextIO


@dataclass(frozen=True, slots=True)
class Hop:
    scenario: str
    name: str
    seconds: float


@dataclass(frozen=True, slots=True)
class Outcome:
    scenario: str
    ok: bool
    seconds: float
    detail: str
    skipped: bool = False

    @property
    def verdict(self) -> str:
        return "skipped" if self.skipped else "ok" if self.ok else "FAILED"


@dataclass
class Timeline:
    out: TextIO | None = field(default_factory=lambda: sys.stdout)
    started: float = field(default_factory=time.monotonic)
    hops: list[Hop] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def step(self, text: str, **keys: object) -> None:
        suffix = "".join(f" {k}={v}" for k, v in keys.items())
        line = f"[{self.elapsed():8.3f}s] {text}{suffix}"
        self.lines.append(line)
        if self.out is not None:
            print(line, file=self.out, flush=True)

    def hop(self, scenario: str, name: str, seconds: float) -> None:
        self.hops.append(Hop(scenario, name, seconds))
        self.step(f"  hop {name}: {seconds * 1000:.1f} ms")

    def result(self, scenario: str, ok: bool, seconds: float, detail: str = "", skipped: bool = False) -> None:
        outcome = Outcome(scenario, ok, seconds, detail, skipped)
        self.outcomes.append(outcome)
        verdict = "PASSED" if outcome.verdict == "ok" else outcome.verdict.upper()
        self.step(f"scenario {scenario}: {verdict} in {seconds:.1f}s" + (f" ({detail})" if detail else ""))

    def hops_of(self, scenario: str) -> dict[str, float]:
        return {h.name: h.seconds for h in self.hops if h.scenario == scenario}

    def summary(self) -> str:
        rows = [("scenario", "result", "time", "what happened / hop", "latency")]
        for outcome in self.outcomes:
            rows.append((outcome.scenario, outcome.verdict, f"{outcome.seconds:.1f}s",
                         outcome.detail, ""))  # fmt: skip
            for hop in (h for h in self.hops if h.scenario == outcome.scenario):
                rows.append(("", "", "", f"  {hop.name}", f"{hop.seconds * 1000:.1f} ms"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)
