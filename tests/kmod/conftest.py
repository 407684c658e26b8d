"""Fixtures of the kernel-module tests: the build, and one VM boot for all."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.kmod import vm

KMOD = vm.REPO / "kmod"


@dataclass(frozen=True)
class Built:
    module: Path
    tool: Path


def _require_vm_tools() -> vm.GuestKernel:
    missing = [*vm.missing_tools(), *(t for t in ("make", "gcc") if subprocess.run(
        ["sh", "-c", f"command -v {t}"], capture_output=True, check=False).returncode)]
    if missing:
        pytest.skip(f"missing system binaries: {', '.join(missing)}")
    try:
        kernel = vm.find_guest_kernel()
    except vm.VMError as err:
        pytest.skip(str(err))
    if not (kernel.headers / "Makefile").exists():
        pytest.skip(f"no kernel headers at {kernel.headers} (install linux-headers-amd64)")
    return kernel


@pytest.fixture(scope="session")
def built() -> Built:
    kernel = _require_vm_tools()
    proc = subprocess.run(
        ["make", "-C", str(KMOD), f"KDIR={kernel.headers}", "all"],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0, f"make -C kmod failed:\n{proc.stdout}\n{proc.stderr}"
    return Built(module=KMOD / "gpushare.ko", tool=KMOD / "tools" / "gpushare-kmodctl")
