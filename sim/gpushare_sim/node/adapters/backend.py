"""Choosing how containers run: a private containerd (via the launcher in
``gpushare_sim.containerd``), a given containerd socket, or plain processes."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
from contextlib import AsyncExitStack
from pathlib import Path

from gpushare_sim.containerd import Containerd, missing_binaries
from gpushare_sim.node.adapters.rootfs import build_base, find_busybox
from gpushare_sim.node.adapters.runners import CtrRunner, ProcessRunner, Runner
from gpushare_sim.node.settings import NodeSimSettings

log = logging.getLogger("gpushare_sim.node.backend")

GPULOAD = "gpuload"


class BackendError(Exception):
    """The requested container backend cannot be used here."""


def ensure_gpuload(tools_dir: Path) -> Path:
    """The static workload program, built with ``make -C tools_dir`` when missing."""
    binary = tools_dir / GPULOAD
    if not binary.exists() and (tools_dir / "Makefile").exists() and shutil.which("make"):
        subprocess.run(["make", "-s", "-C", str(tools_dir)], check=False, capture_output=True)
    if not binary.exists():
        raise BackendError(f"{binary} is missing: run `make -C {tools_dir}` (needs gcc)")
    return binary


def containerd_usable() -> bool:
    return os.geteuid() == 0 and not missing_binaries() and shutil.which("busybox") is not None


def _runtime(settings: NodeSimSettings) -> Path | None:
    if not settings.runtime_binary:
        return None
    path = Path(settings.runtime_binary)
    if not path.exists():
        raise BackendError(f"runtime binary {path} does not exist")
    return path


async def build_runner(settings: NodeSimSettings, stack: AsyncExitStack) -> Runner:
    mode = settings.containerd
    tool_dirs = [settings.tools_dir]
    if mode == "none" or (mode == "auto" and not containerd_usable()):
        log.info("containers run as plain processes node=%s", settings.name)
        return ProcessRunner(tool_dirs)
    gpuload = await asyncio.to_thread(ensure_gpuload, settings.tools_dir)
    base = settings.node_dir / "rootfs-base"
    await asyncio.to_thread(build_base, base, find_busybox(), [gpuload])
    namespace = settings.containerd_namespace
    if mode == "auto":
        ctrd = Containerd()  # a short /tmp base: socket paths are limited to 108 bytes
        await asyncio.to_thread(ctrd.start)
        stack.push_async_callback(asyncio.to_thread, ctrd.stop)
        command = ["ctr", "--address", str(ctrd.address), "-n", namespace]
        flags = ["--runc-root", str(ctrd.base_dir / "runc"), "--fifo-dir", str(ctrd.fifo_dir)]
        log.info("containers run in a private containerd node=%s", settings.name)
        return CtrRunner(command, base, _runtime(settings), flags)
    log.info("containers run in containerd socket=%s node=%s", mode, settings.name)
    return CtrRunner(["ctr", "--address", mode, "-n", namespace], base, _runtime(settings))
