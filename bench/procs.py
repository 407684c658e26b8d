"""Child processes of a benchmark: started, then always terminated (killed after 10 s)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from gpushare_sim.run.lifeline import owned


@contextlib.contextmanager
def process(args: list[str], env: dict[str, str] | None = None, quiet: bool = False,
            log: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``args`` with ``env`` over this process's environment; ``quiet`` drops its output,
    ``log`` appends it to that file."""
    with contextlib.ExitStack() as files:
        output = files.enter_context(log.open("ab")) if log else subprocess.DEVNULL if quiet else None
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

