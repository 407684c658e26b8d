"""Fixtures: the kernel stand-in in this event loop, short socket paths, a hook client."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from gpushare_kmod_bridge import protocol
from gpushare_sim.kernel import KernelStandIn
from gpushare_sim.shorttmp import short_mkdtemp


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    path = short_mkdtemp("kb-")  # unix socket paths are short
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
    """``sleep`` in a pid namespace of its own (``unshare --user --pid --fork``; no root needed);
    with ``second``, another ``sleep`` in the same namespace (its child, :attr:`second_pid`)."""

    def __init__(self, *prefix: str, second: bool = False) -> None:
        if shutil.which("unshare") is None:
            pytest.skip("unshare (util-linux) is not installed")
        command = ["sh", "-c", "sleep 120 & exec sleep 120"] if second else ["sleep", "120"]
        self.proc = subprocess.Popen(
            [*prefix, "unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child", *command],
            stdin=subprocess.DEVNULL)
        self.pid = self._child()
        self.pidns = Path(f"/proc/{self.pid}/ns/pid").stat().st_ino
        self.userns = Path(f"/proc/{self.pid}/ns/user").stat().st_ino
        self.second_pid = self._second() if second else 0

    @property
    def target(self) -> protocol.Target:
        return protocol.Target(self.pidns, self.pid)

    @property
    def inums(self) -> set[int]:
        """The namespace ids it took: its user and its pid namespace."""
        return {self.pidns, self.userns}

    def _child(self) -> int:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
                children = (task / "children").read_text().split()
                if children and Path(f"/proc/{children[0]}/cmdline").read_bytes().startswith(b"sleep"):
                    return int(children[0])
            time.sleep(0.01)
        self.stop()
        raise AssertionError("the unshared child did not start")

    def _second(self) -> int:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
            if children:
                return int(children[0])
            time.sleep(0.01)
        self.stop()
        raise AssertionError("the second process in the namespace did not start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)

    def gone(self) -> bool:
        """Whether its child in the namespace has been reaped (``--kill-child`` kills it with us)."""
        return not Path(f"/proc/{self.pid}").exists()


class Namespaces:
    """Real pid namespaces for a test, each with a live process; all stopped at the end."""

    def __init__(self) -> None:
        self.made: list[PidnsProcess] = []

    def new(self) -> PidnsProcess:
        process = PidnsProcess()
        self.made.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.made:
            process.stop()


@pytest.fixture
def pidns_process() -> Iterator[PidnsProcess]:
    process = PidnsProcess()
    yield process
    process.stop()


@pytest.fixture
def shared_namespace() -> Iterator[PidnsProcess]:
    """A pid namespace with two processes (as two containers of a pod sharing one)."""
    process = PidnsProcess(second=True)
    yield process
    process.stop()


@pytest.fixture
def namespaces() -> Iterator[Namespaces]:
    made = Namespaces()
    yield made
    made.stop_all()


def dead_pid() -> int:
    """The pid of a process that has just exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
