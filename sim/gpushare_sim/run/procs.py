"""Child processes of the local cluster: one process group and one log file each.

A :class:`Child` is started in its own session (so a signal to its group
reaches whatever it started, e.g. ``ctr`` helpers) with stdout and stderr in
``<logs>/<name>.log``. ``stop()`` sends SIGTERM to the group, waits, then
SIGKILLs what is left; it is safe to call twice. ``restart()`` stops and
starts it again with the same command and environment (fault injection).

Ports: a child binds its own (port 0, or nats-server's -1) and reports them in a ports file in
the launcher's directory (:mod:`gpushare_common.ports`); :meth:`Child.wait_ports` reads them
(and its ``http`` address) once it listens. Nothing picks a free port for a child beforehand.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare_common.ports import read_ports

from gpushare_sim.run.lifeline import owned


class ChildError(RuntimeError):
    """A child exited or did not become ready; carries the tail of its log."""

    def __init__(self, name: str, reason: str, log_tail: str = "") -> None:
        self.name = name
        self.reason = reason
        self.log_tail = log_tail
        super().__init__(f"{name}: {reason}" + (f"\n--- {name} log tail ---\n{log_tail}" if log_tail else ""))


def http_text(url: str, timeout: float = 2.0, method: str = "GET") -> str:
    """GET (or POST) ``url``; the body as text; OSError when unreachable."""
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return str(response.read().decode())


def http_json(url: str, timeout: float = 2.0, method: str = "GET") -> Any:
    """GET (or POST) ``url`` and decode its JSON body; OSError when unreachable."""
    return json.loads(http_text(url, timeout, method))


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    http: str = ""  # base URL of its /healthz, /readyz, /status ("" when it has none)
    ports_dir: Path | None = None  # where it reports the ports it bound (None: it reports none)
    ports: dict[str, list[str]] = field(default_factory=dict)  # what it reported, by kind
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    starts: int = 0
    stopping: bool = False  # stopped on purpose: its exit until the next start is no death

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Child:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            out.write(f"--- start {time.strftime('%H:%M:%S')} {' '.join(self.argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(owned(self.argv), env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        self.stopping = False
        self.starts += 1
        return self

    def tail(self, lines: int = 25) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def check_running(self) -> None:
        if self.proc is not None and not self.stopping and self.proc.poll() is not None:
            raise ChildError(self.name, f"exited with status {self.proc.returncode}", self.tail())

    def stop(self, timeout: float = 10.0) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        self.stopping = True  # stop may run in a thread while others check the cluster
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(5)
        _signal_group(proc.pid, signal.SIGKILL)  # helpers it left in its group
        self.proc = None
        return proc.returncode

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Signal the whole process group and reap it (a crash on purpose, no grace)."""
        proc = self.proc
        if proc is None:
            return
        self.stopping = True
        _signal_group(proc.pid, sig)
        proc.wait()
        self.proc = None

    def restart(self, timeout: float = 10.0) -> None:
        self.stop(timeout)
        self.start()

    async def wait_ports(self, timeout: float = 60.0) -> dict[str, list[str]]:
        """Wait until this start of the child reported the ports it bound (``http`` follows)."""
        if self.ports_dir is None:
            raise ChildError(self.name, "reports no ports (no ports directory given)")
        deadline = time.monotonic() + timeout
        while (found := read_ports(self.ports_dir, self.pid)) is None:
            self.check_running()
            if time.monotonic() > deadline:
                raise ChildError(self.name, f"reported no ports in {self.ports_dir} within {timeout:.0f}s",
                                 self.tail())  # fmt: skip
            await asyncio.sleep(0.02)
        self.ports = found
        if found.get("http"):
            self.http = found["http"][0]
        return found

    async def wait_ready(self, path: str = "/readyz", timeout: float = 60.0) -> None:
        """Wait until ``<http><path>`` answers 200 (or, without HTTP, until ``probe`` holds)."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_running()
            if await asyncio.to_thread(_answers, self.http + path):
                return
            if time.monotonic() > deadline:
                raise ChildError(self.name, f"{self.http}{path} not ready within {timeout:.0f}s", self.tail())
            await asyncio.sleep(0.1)

    def rss_bytes(self) -> int:
        """Resident memory of the process (0 when it is not running)."""
        if not self.alive():
            return 0
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return int(response.status) == 200
    except (OSError, urllib.error.HTTPError):
        return False


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def wait_path(path: Path, child: Child, timeout: float = 60.0) -> None:
    """Wait until ``path`` exists while ``child`` keeps running."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(path.exists):
        child.check_running()
        if time.monotonic() > deadline:
            raise ChildError(child.name, f"{path} did not appear within {timeout:.0f}s", child.tail())
        await asyncio.sleep(0.05)


def wait_ports(directory: Path, proc: subprocess.Popen[Any], timeout: float = 30.0) -> dict[str, list[str]]:
    """The ports ``proc`` reported in ``directory`` (see :mod:`gpushare_common.ports`), once it
    has; ``RuntimeError`` when it exits first or does not report within ``timeout``."""
    deadline = time.monotonic() + timeout
    while (found := read_ports(directory, proc.pid)) is None:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with status {proc.returncode} before reporting its ports")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.args!r} reported no ports in {directory} within {timeout:.0f}s")
        time.sleep(0.02)
    return found
