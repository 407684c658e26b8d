"""Fixtures for the runtime tests: a busybox root filesystem and a private containerd."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpushare_sim.containerd import Containerd, missing_binaries

BUSYBOX_APPLETS = ("sh", "cat", "echo", "ls", "stat", "sleep", "true", "printf", "test")


def make_rootfs(directory: Path) -> Path:
    """A tiny root filesystem: static busybox and a few applet links."""
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox (busybox-static) is not installed")
    (directory / "bin").mkdir(parents=True)
    for name in ("dev", "proc", "sys", "tmp"):
        (directory / name).mkdir()
    shutil.copy2(busybox, directory / "bin" / "busybox")
    for applet in BUSYBOX_APPLETS:
        (directory / "bin" / applet).symlink_to("busybox")
    return directory


@pytest.fixture(scope="session")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_rootfs(tmp_path_factory.mktemp("rootfs") / "rootfs")


@pytest.fixture
def containerd() -> Iterator[Containerd]:
    """A containerd of its own on a temporary root and socket, cleaned up after the test."""
    missing = missing_binaries()
    if missing:
        pytest.skip(f"containerd tests need {', '.join(missing)} on PATH")
    with Containerd() as instance:
        yield instance
