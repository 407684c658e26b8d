"""The benchmark's node: nats-server, a private containerd, the API emulator and the solver,
each a real process; a stand-in kmod-bridge answering on the kmod subject in this process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare_common.events import AnyEvent, KmodCommand, KmodReply
from gpushare_sim.containerd import Containerd
from gpushare_sim.run.kubeapi import ensure_namespace

from bench.procs import process
from tests.detector.podres_server import serve_pod_resources
from tests.runtime.conftest import make_rootfs
from tests.support.nats import NatsServer
from tests.support.service import http_env, http_port

NODE = "bench-solver-node"
DEV = "dev"  # the owner's namespace
PREFIX = "benchsolver.v1"


@dataclass
class Bridge:
    """Answers kmod commands at once and remembers when each ``release`` arrived."""

    releases: list[float] = field(default_factory=list)
    released: asyncio.Event = field(default_factory=asyncio.Event)

    async def answer(self, event: AnyEvent) -> KmodReply:
        assert isinstance(event, KmodCommand)
        if event.op == "release":
            self.releases.append(time.perf_counter())
            self.released.set()
        return KmodReply(node=event.node, op=event.op, status=0)


def _wait_file(path: Path, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not start")


@dataclass
class Node:
    nats_url: str
    kubeconfig: Path
    ctrd: Containerd
    rootfs: Path
    ports_dir: Path  # the solver reports the HTTP port it bound here
    pod_resources: Path  # the kubelet's pod-resources socket (a stand-in serving the real API)
    # what that kubelet says each pod was allocated: "<ns>/<pod>" -> container -> resource -> ids
    allocated: dict[str, dict[str, dict[str, tuple[str, ...]]]] = field(default_factory=dict)

    http_port: int = 0  # the solver's, once it serves (started())

    def status(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.http_port}/status"
        with urllib.request.urlopen(url, timeout=5) as response:
            result: dict[str, Any] = json.loads(response.read())
        return result

    def ready(self) -> bool:
        with contextlib.suppress(OSError):
            url = f"http://127.0.0.1:{self.http_port}/readyz"
            with urllib.request.urlopen(url, timeout=1) as response:
                return bool(response.status == 200)
        return False


def solver_env(node: Node) -> dict[str, str]:
    return {**os.environ, "GPUSHARE_NODE_NAME": NODE, "GPUSHARE_NATS_URL": node.nats_url,
            "GPUSHARE_NATS_ENSURE_LAYOUT": "true",
            "GPUSHARE_NATS_PREFIX": PREFIX, "GPUSHARE_NATS_STREAM": "BENCHSOLVER",
            "GPUSHARE_NATS_KV_PREFIX": "benchsolver", "GPUSHARE_HTTP_HOST": "127.0.0.1",
            **http_env(node.ports_dir), "GPUSHARE_KUBE_KUBECONFIG": str(node.kubeconfig),
            "GPUSHARE_SOLVER_CONTAINERD_ADDRESS": str(node.ctrd.address),
            "GPUSHARE_SOLVER_POD_RESOURCES_SOCKET": str(node.pod_resources),  # looked up at every reclaim
            "GPUSHARE_LOG_LEVEL": "WARNING"}


@contextlib.asynccontextmanager
async def started() -> AsyncIterator[Node]:
    work = Path(tempfile.mkdtemp(prefix="bench-solver-"))
    nats = NatsServer().start()
    try:
        with Containerd() as ctrd, process(
                [sys.executable, "-m", "gpushare_sim.apiserver", "--port", "0",
                 "--kubeconfig", str(work / "kubeconfig")]) as api:
            _wait_file(work / "kubeconfig", api, "API emulator")
            for namespace in (DEV, "spot"):
                await asyncio.to_thread(ensure_namespace, work / "kubeconfig", namespace)
            node = Node(nats.url, work / "kubeconfig", ctrd, make_rootfs(work / "rootfs"), work,
                        work / "pod-resources.sock")
            async with serve_pod_resources(node.pod_resources) as kubelet:  # confirms every eviction
                node.allocated = kubelet.table
                with process([sys.executable, "-m", "gpushare_solver"], solver_env(node)) as solver:
                    node.http_port = await asyncio.to_thread(http_port, work, solver)
                    deadline = time.monotonic() + 30
                    while not await asyncio.to_thread(node.ready):
                        if solver.poll() is not None or time.monotonic() > deadline:
                            raise RuntimeError("the solver did not become ready")
                        await asyncio.sleep(0.05)
                    yield node
    finally:
        nats.cleanup()
