"""The node's MPS control daemon as a child process of the driver: start, answer, stop.

The daemon is a shell command line (``sh -c``) run with the MPS directories in its
environment; it answers once its control socket (``<pipe>/control``) accepts a connection,
which is also how a daemon another instance of the driver started (a rolling update) is
recognised. Stopping sends SIGTERM to its process group and SIGKILL after ``grace_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Mapping


def control_answers(path: str) -> bool:
    """Whether a daemon listens on the control socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.2)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


class DaemonProcess:
    def __init__(self, command: str, env: Mapping[str, str], directories: list[str]) -> None:
        self.command = command
        self.env = dict(env)
        self.directories = directories
        self.process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.running() and self.process is not None else None

    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> None:
        for path in self.directories:
            os.makedirs(path, mode=0o777, exist_ok=True)
        self.process = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", self.command, env={**os.environ, **self.env}, stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True)

    async def stop(self, grace_s: float = 5.0) -> int | None:
        """Stop it (safe twice); its exit status."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), grace_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        return process.returncode
