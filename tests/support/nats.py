"""A real nats-server with JetStream for tests: free port, temporary store, clean stop."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from gpushare_sim.natsd import NatsNotInstalled, server_binary
from gpushare_sim.run.lifeline import owned

from tests.support import procs


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def nats_binary() -> str | None:
    try:
        return server_binary()
    except NatsNotInstalled:
        return None


class NatsServer:
    """``nats-server -js`` on 127.0.0.1; ``restart()`` keeps port and store."""

    def __init__(self, store_dir: str | None = None, config: str | None = None) -> None:
        self.port = free_port()
        self.store_dir = store_dir or tempfile.mkdtemp(prefix="gpushare-nats-")
        self.config = config
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> NatsServer:
        binary = nats_binary()
        if binary is None:
            raise RuntimeError("nats-server not installed: run `make deps`")
        args = [binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", self.store_dir]
        if self.config:
            args += ["-c", self.config]
        self.proc = subprocess.Popen(owned(args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.allow(self.proc.pid)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}")
            time.sleep(0.02)
        raise RuntimeError("nats-server did not start listening within 10s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            procs.disallow(self.proc.pid)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.store_dir, ignore_errors=True)


def unique_prefix(name: str) -> str:
    token = "".join(c if c.isalnum() else "_" for c in name)[-40:]
    return f"t{os.getpid()}_{token}_{time.monotonic_ns() % 10**9}"
