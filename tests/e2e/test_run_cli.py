"""``python -m gpushare_sim.run``: --keep lists live status endpoints; Ctrl-C leaves nothing behind."""

from __future__ import annotations

import json
import os
import re
import shutil
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
    """Processes whose command line names ``path``, or whose root or working directory lies
    under it (a container's processes run in a root file system there)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                places = [os.readlink(entry / link) for link in ("root", "cwd")]
            except OSError:
                continue
            if path in cmdline or any(p.startswith(path) for p in places):
                found.append(f"{entry.name}: {cmdline}")
    return found


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pids: set[int]) -> set[int]:
    return {p for p in pids if Path(f"/proc/{p}").exists() and "Z" not in _state(p)}


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def _start_runner(until: str = "") -> tuple[subprocess.Popen[str], str, list[str]]:
    """``make run ARGS=--keep``'s runner, up with every service (or, with ``until``, only until its
    output has a line with that text); its run directory and output."""
    proc = subprocess.Popen([sys.executable, "-m", "gpushare_sim.run", "--scenario", "none", "--keep"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    lines: list[str] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 180

    def up() -> bool:
        if until:
            return any(until in line for line in lines)
        return any("solver@" in line and "/status" in line and "  solver" in line for line in lines)

    while not up():
        line = proc.stdout.readline()
        assert line and time.monotonic() < deadline, "no status endpoints listed:\n" + "".join(lines)
        lines.append(line)
    return proc, re.search(r"path=(\S+)", lines[0]).group(1), lines  # type: ignore[union-attr]


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)
    if proc.stdout is not None:
        proc.stdout.close()


def _nothing_left(run_dir: str, started: set[int], sig: signal.Signals) -> None:
    deadline = time.monotonic() + 60
    while (left := [*_mentions(run_dir), *map(str, _alive(started))]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"left running after {sig.name} of the runner: {left}"
    assert run_dir not in Path("/proc/self/mounts").read_text()


def _interrupt(proc: subprocess.Popen[str], run_dir: str, sig: signal.Signals, parts: int) -> None:
    """``sig`` to a runner that started at least ``parts`` processes: it ends with 130, and so does
    everything it started; its run directory is gone."""
    started = _descendants(proc.pid)
    assert len(started) >= parts and _mentions(run_dir)
    proc.send_signal(sig)
    assert proc.wait(120) == 130
    _nothing_left(run_dir, started, sig)
    assert not Path(run_dir).exists()


def test_keep_lists_status_endpoints_and_ctrl_c_tears_everything_down() -> None:
    """Ctrl-C of a runner with everything up: it answers its status endpoints until then, and every
    process it started (nats-server, the API emulator, the kernel stand-in, the node simulator's
    containerd and containers, every service) ends, its run directory removed."""
    needs()
    proc, run_dir, lines = _start_runner()
    try:
        url = re.search(r"(http://\S+/status)", lines[-1]).group(1)  # type: ignore[union-attr]
        with urllib.request.urlopen(url, timeout=5) as response:
            assert json.loads(response.read())["node"] == "gpu-node-1"
        _interrupt(proc, run_dir, signal.SIGINT, parts=8)  # the cluster's parts and their helpers
    finally:
        _stop(proc)


def test_a_runner_terminated_while_it_starts_leaves_nothing() -> None:
    """SIGTERM (the same handler as Ctrl-C) while the cluster is half up: what was started ends."""
    needs()
    proc, run_dir, _ = _start_runner(until="node gpu-node-1 up")
    try:
        _interrupt(proc, run_dir, signal.SIGTERM, parts=3)  # nats-server, the API emulator, the node's parts
    finally:
        _stop(proc)
        shutil.rmtree(run_dir, ignore_errors=True)


def test_nothing_outlives_a_runner_that_is_killed() -> None:
    """SIGKILL of a runner with everything up: the kernel ends every process it started (each
    started with a parent-death signal), containerd's containers included."""
    needs()
    proc, run_dir, _ = _start_runner()
    try:
        started = _descendants(proc.pid)
        assert len(started) >= 8 and _mentions(run_dir)
        proc.send_signal(signal.SIGKILL)
        proc.wait(120)
        _nothing_left(run_dir, started, signal.SIGKILL)
    finally:
        _stop(proc)
        shutil.rmtree(run_dir, ignore_errors=True)
