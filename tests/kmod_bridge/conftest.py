"""Fixtures: the kernel stand-in in this event loop, short socket paths, a hook client."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from gpushare_sim.kernel import KernelStandIn


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kb-", dir="/tmp"))  # unix socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kernel(sock_dir: Path) -> AsyncIterator[KernelStandIn]:
    stand_in = KernelStandIn(str(sock_dir / "kmod.sock"), str(sock_dir / "hook.sock"), timeout_ms=3000)
    await stand_in.start()
    yield stand_in
    await stand_in.close()


async def ioctl(hook_path: str, pidns: int, pid: int = 4242, ioctl_type: int = 0x46) -> float:
    """One simulated GPU ioctl through the hook socket; returns the ms the kernel held it."""
    reader, writer = await asyncio.open_unix_connection(hook_path)
    try:
        writer.write(json.dumps({"pidns": pidns, "pid": pid, "type": ioctl_type}).encode() + b"\n")
        await writer.drain()
        answer = json.loads(await reader.readline())
    finally:
        writer.close()
    return float(answer["blocked_ms"])


async def wait_until(predicate, timeout: float = 5.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.005)


class PidnsProcess:
    """``sleep`` in a pid namespace of its own (``unshare --user --pid --fork``; no root needed)."""

    def __init__(self, *prefix: str) -> None:
        import shutil as _shutil
        import subprocess

        if _shutil.which("unshare") is None:
            pytest.skip("unshare (util-linux) is not installed")
        self.proc = subprocess.Popen(
            [*prefix, "unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child",
             "sleep", "120"], stdin=subprocess.DEVNULL)
        self.pid = self._child()
        self.pidns = Path(f"/proc/{self.pid}/ns/pid").stat().st_ino

    def _child(self) -> int:
        import time

        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
                children = (task / "children").read_text().split()
                if children and Path(f"/proc/{children[0]}/cmdline").read_bytes().startswith(b"sleep"):
                    return int(children[0])
            time.sleep(0.01)
        self.stop()
        raise AssertionError("the unshared child did not start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)


@pytest.fixture
def pidns_process() -> Iterator[PidnsProcess]:
    process = PidnsProcess()
    yield process
    process.stop()
