"""The owner's view, end to end: a GPU call from the owner's container blocks in the kernel
stand-in until the real kmod-bridge, told by the stand-in, has had the real solver kill and evict
the borrowers and release the owner. Figure: how long the owner's call was held."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from gpushare_common.bus import Bus, Transient
from gpushare_common.events import KmodCommand
from gpushare_solver.outbox import BusOutbox

from bench.procs import process
from bench.solver.node import NODE, PREFIX, Node
from tests.solver.world import NAMESPACE

OWNER_CONTAINER = "owner-main"
CRI = {"io.kubernetes.cri.sandbox-namespace": "dev", "io.kubernetes.cri.sandbox-name": "owner",
       "io.kubernetes.cri.container-name": "c0"}


def _bridge_env(node: Node, kmod_socket: Path) -> dict[str, str]:
    return {**os.environ, "GPUSHARE_NODE_NAME": NODE, "GPUSHARE_NATS_URL": node.nats_url,
            "GPUSHARE_NATS_ENSURE_LAYOUT": "true",
            "GPUSHARE_NATS_PREFIX": PREFIX, "GPUSHARE_NATS_STREAM": "BENCHSOLVER",
            "GPUSHARE_NATS_KV_PREFIX": "benchsolver", "GPUSHARE_HTTP_HOST": "127.0.0.1",
            "GPUSHARE_HTTP_PORT": "0", "GPUSHARE_LOG_LEVEL": "WARNING",
            "GPUSHARE_KMOD_TRANSPORT": "sim", "GPUSHARE_KMOD_SIM_SOCKET": str(kmod_socket),
            "GPUSHARE_KMOD_SOURCES": "containerd", "GPUSHARE_KMOD_CONTAINERD_ADDRESS": str(node.ctrd.address),
            "GPUSHARE_KMOD_REFRESH_S": "0.2", "GPUSHARE_KMOD_HEARTBEAT_S": "0.5"}


@contextlib.contextmanager
def kernel_and_bridge(node: Node, work: Path) -> Iterator[Path]:
    """The kernel stand-in and the kmod-bridge as processes; yields the hook socket."""
    kmod, hook = work / "kmod.sock", work / "hook.sock"
    with process([sys.executable, "-m", "gpushare_sim.kernel", "--socket", str(kmod),
                   "--hook-socket", str(hook), "--timeout-ms", "3000"]):
        deadline = time.monotonic() + 20
        while not (kmod.exists() and hook.exists()):
            if time.monotonic() > deadline:
                raise RuntimeError("the kernel stand-in did not start")
            time.sleep(0.05)
        with process([sys.executable, "-m", "gpushare_kmod_bridge"], _bridge_env(node, kmod)):
            yield hook


def start_owner(node: Node) -> tuple[int, int]:
    """The owner's container (CRI annotations name its pod); returns (pid, pid namespace)."""
    node.ctrd.run(node.rootfs, OWNER_CONTAINER, "/bin/sleep", "3600", detach=True, namespace=NAMESPACE,
                  annotations=CRI)
    listed = node.ctrd.ctr("task", "ls", namespace=NAMESPACE).stdout.splitlines()[1:]
    pid = next(int(line.split()[1]) for line in listed if line.split()[0] == OWNER_CONTAINER)
    return pid, os.stat(f"/proc/{pid}/ns/pid").st_ino


async def detect_ready(bus: Bus, owner: str, timeout: float = 20.0) -> None:
    """Wait until the bridge resolves the owner's pod to its pid namespace (detect succeeds)."""
    outbox = BusOutbox(bus, NODE, 2.0)
    deadline = time.monotonic() + timeout
    while True:
        try:
            reply = await outbox.kmod(KmodCommand(node=NODE, op="detect", pods=(owner,)))
            if reply.status >= 0 and reply.pidns:
                return
            why = reply.message
        except Transient as err:  # the bridge is not serving yet
            why = str(err)
        if time.monotonic() > deadline:
            raise TimeoutError(f"the kmod-bridge never resolved {owner}: {why}")
        await asyncio.sleep(0.1)


async def owner_ioctl(hook: Path, pidns: int, pid: int) -> tuple[float, float]:
    """One simulated GPU ioctl: (ms the stand-in held it, ms until the answer came back)."""
    start = time.perf_counter()
    reader, writer = await asyncio.open_unix_connection(str(hook))
    try:
        writer.write(json.dumps({"pidns": pidns, "pid": pid, "type": 0x46}).encode() + b"\n")
        await writer.drain()
        answer = json.loads(await asyncio.wait_for(reader.readline(), 10))
    finally:
        writer.close()
    return float(answer["blocked_ms"]), (time.perf_counter() - start) * 1000


@contextlib.asynccontextmanager
async def chain(node: Node, work: Path) -> AsyncIterator[Path]:
    with kernel_and_bridge(node, work) as hook:
        yield hook
