"""A real nats-server with JetStream for tests: a port it binds itself (any free one, read back
from its ports file), a temporary store, clean stop."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from gpushare_common.ports import port_of
from gpushare_sim.natsd import ANY_PORT, NatsNotInstalled, server_binary
from gpushare_sim.run.lifeline import owned
from gpushare_sim.run.procs import wait_ports

from tests.support import procs


def nats_binary() -> str | None:
    try:
        return server_binary()
    except NatsNotInstalled:
        return None


class NatsServer:
    """``nats-server -js`` on 127.0.0.1; ``restart()`` keeps port and store."""

    def __init__(self, store_dir: str | None = None, config: str | None = None) -> None:
        self.port = ANY_PORT  # the port it bound, once started (a restart takes it back)
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
        args = [binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", self.store_dir,
                "--ports_file_dir", self.store_dir]  # fmt: skip
        if self.config:
            args += ["-c", self.config]
        self.proc = subprocess.Popen(owned(args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.allow(self.proc.pid)
        self.port = port_of(wait_ports(Path(self.store_dir), self.proc, timeout=10)["nats"][0])
        return self

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
