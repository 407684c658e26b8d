"""The images' install step (compose/image-install.sh), run for every service into a clean
virtual environment: the service package and gpushare-common install from source alone and
the service's entry point imports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "compose" / "image-install.sh"
UV = ROOT / ".bootstrap" / "bin" / "uv"
SERVICES = ["detector", "solver", "deviceplugin", "kmod-bridge", "shadow-controller", "nats-auth", "console"]


@pytest.mark.slow
@pytest.mark.parametrize("service", SERVICES)
def test_image_install(service: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable.replace(".venv/bin/python", ".bootstrap/bin/python")}
    if UV.exists():
        env["UV"] = str(UV)
    prefix = tmp_path / "opt"
    result = subprocess.run([str(SCRIPT), service, str(prefix)], capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[4/4] checking the entry point" in result.stdout and "ok: gpushare_" in result.stdout
    script = prefix / "bin" / f"gpushare-{service}"
    assert script.exists(), f"no console script {script.name}"
    # the installed tree is independent of the repository: no path back into it
    assert str(ROOT) not in (prefix / "bin" / f"gpushare-{service}").read_text()


def test_unknown_service_is_refused(tmp_path: Path) -> None:
    result = subprocess.run([str(SCRIPT), "nonsense", str(tmp_path / "x")], capture_output=True, text=True)
    assert result.returncode == 2 and "unknown service 'nonsense'" in result.stderr
