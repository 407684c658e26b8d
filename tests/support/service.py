"""A service started as its own process in a test: HTTP on loopback, on a port it binds itself
(any free one) and reports in a ports file (:mod:`gpushare_common.ports`), read back here."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from gpushare_common.ports import port_of
from gpushare_common.settings import HTTP_PREFIX, HttpSettings, env_of
from gpushare_sim.run.procs import wait_ports


def http_env(ports_dir: Path) -> dict[str, str]:
    """The service's HTTP settings: loopback, any free port, reported in ``ports_dir``."""
    return env_of(HttpSettings, HTTP_PREFIX, host="127.0.0.1", port=0, ports_dir=str(ports_dir))


def http_port(ports_dir: Path, proc: subprocess.Popen[Any], timeout: float = 30.0) -> int:
    """The port ``proc`` bound, once it serves HTTP (``RuntimeError`` if it exits first)."""
    return port_of(wait_ports(ports_dir, proc, timeout)["http"][0])
