"""Fixtures for the runtime tests: a busybox root filesystem and a private containerd."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpushare_sim.containerd import Containerd, missing_binaries

from tests.support.kubelet import Kubelet

from .builders import write_config

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


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """This test's directory, under /tmp whatever ``TMPDIR`` says: the containers here bind paths
    of it at the same path, and a container mounts a tmpfs of its own on /dev/shm (where
    ``make test`` keeps ``TMPDIR``), which would hide them. Removed after the test unless
    something is still mounted below it."""
    path = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    yield path
    mounts = Path("/proc/self/mounts").read_text()
    if f" {path}/" not in mounts and f" {path} " not in mounts:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_rootfs(tmp_path_factory.mktemp("rootfs") / "rootfs")


@pytest.fixture
def containerd(tmp_path: Path, kubelet: Kubelet) -> Iterator[Containerd]:
    """A containerd of its own on a temporary root and socket, cleaned up after the test.

    Its runtimes read ``tmp_path/runtime.json`` as the gpushare runtime configuration.
    """
    missing = missing_binaries()
    if missing:
        pytest.skip(f"containerd tests need {', '.join(missing)} on PATH")
    if os.geteuid() != 0:
        pytest.skip("containerd tests need root")
    config = write_config(tmp_path / "runtime.json", pod_resources_socket=str(kubelet.socket))
    env = {**os.environ, "GPUSHARE_RUNTIME_CONFIG": str(config)}
    with Containerd(env=env) as instance:
        yield instance


REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def runtime_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gpushare-runtime installed by its install script into a temporary bin directory."""
    if shutil.which("runc") is None:
        pytest.skip("runc is not installed")
    bin_dir = tmp_path_factory.mktemp("bin")
    subprocess.run([str(REPO / "runtime" / "install" / "install.sh"), str(bin_dir)],
                   check=True, capture_output=True)
    return bin_dir / "gpushare-runtime"


class Runc:
    """runc (or gpushare-runtime) on a private state root; removes its containers on close."""

    def __init__(self, root: Path, runtime_bin: Path, env: dict[str, str]) -> None:
        self.root = root
        self.runtime_bin = runtime_bin
        self.env = env

    def __call__(self, *args: str, through: bool = True, log: Path | None = None,
                 timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        binary = str(self.runtime_bin) if through else "runc"
        flags = ["--root", str(self.root)]
        if log is not None:
            flags += ["--log", str(log), "--log-format", "json"]
        # files, not pipes: a created container keeps its stdio open after runc exits
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            done = subprocess.run([binary, *flags, *args], stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=err, timeout=timeout, env=self.env, check=False)
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess(done.args, done.returncode,
                                               out.read().decode(), err.read().decode())

    def close(self) -> None:
        listed = self("list", "-q", through=False)
        for container in listed.stdout.split():
            self("kill", container, "KILL", through=False)
            self("delete", "-f", container, through=False)


@pytest.fixture
def runc(tmp_path: Path, runtime_bin: Path, kubelet: Kubelet) -> Iterator[Runc]:
    if os.geteuid() != 0:
        pytest.skip("runc tests need root")
    config = write_config(tmp_path / "runtime.json", pod_resources_socket=str(kubelet.socket))
    env = {**os.environ, "GPUSHARE_RUNTIME_CONFIG": str(config)}
    instance = Runc(tmp_path / "runc-root", runtime_bin, env)
    yield instance
    instance.close()
