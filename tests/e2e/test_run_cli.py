"""``python -m gpushare_sim.run``: --keep lists live status endpoints; Ctrl-C leaves nothing behind."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.conftest import needs

pytestmark = pytest.mark.slow


def test_unknown_scenario_is_refused_clearly() -> None:
    result = subprocess.run([sys.executable, "-m", "gpushare_sim.run", "--scenario", "nope"],
                            capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    assert result.returncode == 2 and "unknown scenario 'nope'" in result.stderr


def _mentions(path: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if path in cmdline:
                found.append(f"{entry.name}: {cmdline}")
    return found


def test_keep_lists_status_endpoints_and_ctrl_c_tears_everything_down() -> None:
    needs()
    proc = subprocess.Popen([sys.executable, "-m", "gpushare_sim.run", "--scenario", "none", "--keep"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 180
        while not any("solver@" in line and "/status" in line and "  solver" in line for line in lines):
            line = proc.stdout.readline()
            assert line and time.monotonic() < deadline, "no status endpoints listed:\n" + "".join(lines)
            lines.append(line)
        run_dir = re.search(r"path=(\S+)", lines[0]).group(1)  # type: ignore[union-attr]
        url = re.search(r"(http://\S+/status)", lines[-1]).group(1)  # type: ignore[union-attr]
        with urllib.request.urlopen(url, timeout=5) as response:
            assert json.loads(response.read())["node"] == "gpu-node-1"
        assert _mentions(run_dir)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 130
        assert not Path(run_dir).exists()
        assert _mentions(run_dir) == []
        assert run_dir not in Path("/proc/self/mounts").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
