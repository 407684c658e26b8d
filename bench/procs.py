"""Child processes of a benchmark: started, then always terminated (killed after 10 s)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator

from gpushare_sim.run.lifeline import owned


@contextlib.contextmanager
def process(args: list[str], env: dict[str, str] | None = None,
            quiet: bool = False) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``args`` with ``env`` over this process's environment; ``quiet`` drops its output."""
    output = subprocess.DEVNULL if quiet else None
    proc = subprocess.Popen(owned(args), env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
                            stdout=output, stderr=output)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
