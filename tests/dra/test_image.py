"""The DRA driver's image install step (compose/image-install.sh, what its Dockerfile runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UV = ROOT / ".bootstrap" / "bin" / "uv"


@pytest.mark.slow
def test_image_install_of_the_dra_driver(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable.replace(".venv/bin/python", ".bootstrap/bin/python")}
    if UV.exists():
        env["UV"] = str(UV)
    prefix = tmp_path / "opt"
    result = subprocess.run([str(ROOT / "compose" / "image-install.sh"), "dra-driver", str(prefix)],
                            capture_output=True, text=True, env=env, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok: gpushare_dra_driver" in result.stdout
    check = subprocess.run([str(prefix / "bin" / "python"), "-c",
                            "import gpushare_common.adapters.kubeletapi.dra_v1_pb2_grpc, "
                            "gpushare_common.adapters.kubeletapi.pluginregistration_v1_pb2_grpc"],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    assert (prefix / "bin" / "gpushare-dra-driver").exists()
    build = (ROOT / "services" / "dra-driver" / "Dockerfile").read_text()
    assert "docker build -f services/dra-driver/Dockerfile -t gpushare/dra-driver:0.1.0 ." in build
