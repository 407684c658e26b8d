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

    @property
    def ioctl32(self) -> Path:
        return self.tool.with_name("gpushare-ioctl32")


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
    module, tool = vm.build_kmod(_require_vm_tools())
    return Built(module=module, tool=tool)
