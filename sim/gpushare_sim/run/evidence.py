"""What a failed run keeps for a post-mortem: its services' logs, and the lines that matter.

A soak or an end-to-end scenario that fails copies the run directory's ``logs/`` under
``.run/<label>-<time>/`` (the run directory itself is removed when the cluster stops) and prints
the node services' commands to the kernel, reclaims, refusals and warnings, so a failure seen once
in CI can be read without running it again.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import time
from pathlib import Path

EVIDENCE = re.compile(r"kmod command|forgetting|no longer the watched|another container|owner back|"
                      r"reclaim|release|refused|evicted|WARNING|ERROR")  # fmt: skip
SERVICES = ("kmod-bridge", "detector", "solver")


def keep_evidence(logs: Path, label: str, last: int = 40) -> Path | None:
    """Copy ``logs`` to ``.run/<label>-<time>`` and print each node service's telling lines (the
    ``last`` of each); the copy's path, None when it could not be made."""
    target = Path(".run") / f"{label}-{time.strftime('%Y%m%d-%H%M%S')}"
    kept: Path | None = target
    try:
        shutil.copytree(logs, target)
        print(f"\nthe services' logs are kept in {target}", flush=True)
    except OSError as err:
        print(f"\nthe services' logs could not be kept: {err}", flush=True)
        kept = None
    for name in SERVICES:
        for log_file in sorted(logs.glob(f"{name}@*.log")):
            with contextlib.suppress(OSError):
                lines = [line[:300] for line in log_file.read_text(errors="replace").splitlines()
                         if EVIDENCE.search(line)]  # fmt: skip
                print(f"--- {log_file.name} (commands, reclaims, warnings; last {last}) ---", *lines[-last:],
                      sep="\n", flush=True)  # fmt: skip
    return kept
