"""kmod/install.sh on this machine: clear errors, and the build path."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.kmod.vm import REPO, find_guest_kernel

INSTALL = REPO / "kmod" / "install.sh"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(INSTALL), *args], capture_output=True, text=True, check=False)


def test_missing_headers_is_a_clear_error(tmp_path: Path) -> None:
    proc = run("--kdir", str(tmp_path / "none"))
    assert proc.returncode == 2
    assert "kernel headers" in proc.stderr and "linux-headers-" in proc.stderr


def test_unknown_argument_is_refused() -> None:
    proc = run("--frobnicate")
    assert proc.returncode == 64 and "unknown argument" in proc.stderr


def test_missing_prebuilt_module_is_refused(tmp_path: Path) -> None:
    proc = run("--ko", str(tmp_path / "gpushare.ko"))
    assert proc.returncode == 5 and "no module file" in proc.stderr


def test_build_only_produces_a_versioned_module(tmp_path: Path) -> None:
    if shutil.which("make") is None or shutil.which("gcc") is None:
        pytest.skip("make or gcc is not installed")
    kernel = find_guest_kernel()
    if not (kernel.headers / "Makefile").exists():
        pytest.skip(f"no kernel headers at {kernel.headers}")
    proc = run("--build-only", str(tmp_path / "build"), "--kdir", str(kernel.headers))
    assert proc.returncode == 0, proc.stderr
    module = Path(proc.stdout.strip().splitlines()[-1])
    source = (REPO / "kmod" / "gpushare_internal.h").read_text()
    want = re.search(r'#define GPUSHARE_MODULE_VERSION "([^"]+)"', source)
    assert want is not None
    assert f"version={want.group(1)}".encode() in module.read_bytes()
