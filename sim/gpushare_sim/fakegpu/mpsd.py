"""A stand-in for NVIDIA's MPS control daemon (``python -m gpushare_sim.fakegpu.mpsd``).

The fake cards have no MPS. This process does what the DRA driver and the scenarios can see of
the real daemon: it listens on ``$CUDA_MPS_PIPE_DIRECTORY/control`` (the driver's readiness
check), writes ``control.log`` in ``$CUDA_MPS_LOG_DIRECTORY`` (one line when it starts and one
when it quits), and quits on SIGTERM or SIGINT, removing its socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

PIPE_VARIABLE = "CUDA_MPS_PIPE_DIRECTORY"
LOG_VARIABLE = "CUDA_MPS_LOG_DIRECTORY"


def _log(directory: Path, line: str) -> None:
    with contextlib.suppress(OSError), (directory / "control.log").open("a") as log:
        log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} pid {os.getpid()} {line}\n")


async def serve(pipe: Path, logs: Path) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    control = pipe / "control"
    with contextlib.suppress(FileNotFoundError):
        control.unlink()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_unix_server(answer, path=str(control))
    _log(logs, "started")
    try:
        await stop.wait()
    finally:
        server.close()
        await server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            control.unlink()
        _log(logs, "quit")


def main() -> int:
    pipe, logs = os.environ.get(PIPE_VARIABLE), os.environ.get(LOG_VARIABLE)
    if not pipe or not logs:
        print(f"mpsd: {PIPE_VARIABLE} and {LOG_VARIABLE} must be set", file=sys.stderr)
        return 2
    Path(pipe).mkdir(parents=True, exist_ok=True)
    Path(logs).mkdir(parents=True, exist_ok=True)
    asyncio.run(serve(Path(pipe), Path(logs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
