"""Child processes of a benchmark: started, then always terminated (killed after 10 s)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from gpushare_sim.node.adapters.kube import SimKube
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


async def create_namespaces(kubeconfig: Path, names: Iterable[str], within_s: float = 30.0) -> None:
    """Create these namespaces in the API emulator (waiting for it to listen): a namespaced
    object needs its namespace, as on a cluster."""
    kube = SimKube.from_kubeconfig(str(kubeconfig))
    try:
        deadline = time.monotonic() + within_s
        for name in names:
            while True:
                try:
                    await kube.create_object("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                                    "metadata": {"name": name}})
                    break
                except OSError:  # not listening yet
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)
    finally:
        await kube.close()
