"""The direct kill: only a process whose cgroup names the container is signalled."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpushare_solver.adapters.signals import kill_init


def test_kill_init_checks_the_cgroup_before_signalling() -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        cgroup = Path(f"/proc/{child.pid}/cgroup").read_text().splitlines()[-1].split(":", 2)[2]
        assert not kill_init(child.pid, "container-that-is-not-this-one")
        assert child.poll() is None
        assert kill_init(child.pid, cgroup)
        assert child.wait(timeout=10) == -9
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_kill_init_of_a_missing_process_is_false() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    assert not kill_init(child.pid, "x")
    assert not kill_init(0, "x") and not kill_init(1, "")
