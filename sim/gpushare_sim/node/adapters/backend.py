"""Choosing how containers run: a private containerd (via the launcher in
``gpushare_sim.containerd``), a given containerd socket, or plain processes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
from contextlib import AsyncExitStack
from pathlib import Path

from gpushare_sim.containerd import Containerd, missing_binaries
from gpushare_sim.fakegpu.vendor import vendor_table
from gpushare_sim.node.adapters.rootfs import build_base, find_busybox
from gpushare_sim.node.adapters.runners import CtrRunner, ProcessRunner, Runner
from gpushare_sim.node.settings import NodeSimSettings

log = logging.getLogger("gpushare_sim.node.backend")

GPULOAD = "gpuload"
HOG = "hog"
RUNTIME_CONFIG_ENV = "GPUSHARE_RUNTIME_CONFIG"
RUNTIME_NAME = "gpushare-runtime"


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


def runtime_config(settings: NodeSimSettings) -> Path:
    """The gpushare runtime's configuration for this node: its CDI specs, signing key and vendor
    table (the fake cards' isolation profile, :mod:`gpushare_sim.fakegpu.vendor`)."""
    path = settings.node_dir / "runtime.json"
    doc = {
        "lower_runtime": "runc",
        "key_file": str(signing_key(settings.node_dir)),
        "cdi_dirs": [str(settings.node_dir / "cdi")],
        "node_name": settings.name,  # signatures bind it
        "pod_resources_socket": str(settings.pod_resources_socket),  # copies need the kubelet's word
        "vendors": vendor_table(),
    }
    path.write_text(json.dumps(doc, indent=1))
    return path


def signing_key(node_dir: Path) -> Path:
    """The node's HMAC key (root-only), shared by the device plugins and the runtime."""
    key = node_dir / "signing.key"
    if not key.exists():
        node_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_hex(32).encode())
    return key


def _link(link: Path, target: Path) -> None:
    """A stable name for the private containerd's socket, inside the node directory."""
    link.unlink(missing_ok=True)
    link.symlink_to(target)


def runtime_binary(setting: str) -> Path | None:
    """``auto``: gpushare-runtime beside this interpreter when installed; ``none``/empty: runc."""
    if setting in ("", "none"):
        return None
    if setting == "auto":
        candidate = Path(sys.executable).parent / RUNTIME_NAME
        return candidate if candidate.exists() else None
    path = Path(setting)
    if not path.exists():
        raise BackendError(f"runtime binary {path} does not exist")
    return path


async def build_runner(settings: NodeSimSettings, stack: AsyncExitStack) -> Runner:
    mode = settings.containerd
    tool_dirs = [settings.tools_dir]
    if mode == "none" or (mode == "auto" and not containerd_usable()):
        log.info("containers run as plain processes node=%s", settings.name)
        try:
            await asyncio.to_thread(ensure_gpuload, settings.tools_dir)
        except BackendError as err:
            log.warning("workload program unavailable node=%s: %s", settings.name, err)
        return ProcessRunner(tool_dirs)
    gpuload = await asyncio.to_thread(ensure_gpuload, settings.tools_dir)
    base = settings.node_dir / "rootfs-base"
    extra = [t for t in (settings.tools_dir / HOG,) if t.exists()]  # hog: a borrower slow to die
    await asyncio.to_thread(build_base, base, find_busybox(), [gpuload, *extra])
    namespace = settings.containerd_namespace
    if mode == "auto":
        runtime = runtime_binary(settings.runtime_binary)
        env = None
        if runtime is not None:
            env = {**os.environ, RUNTIME_CONFIG_ENV: str(runtime_config(settings))}
        ctrd = Containerd(env=env)  # a short /tmp base: socket paths are limited to 108 bytes
        await asyncio.to_thread(ctrd.start)
        stack.push_async_callback(asyncio.to_thread, ctrd.stop)
        _link(settings.node_dir / "containerd.sock", ctrd.address)
        command = ["ctr", "--address", str(ctrd.address), "-n", namespace]
        flags = ["--runc-root", str(ctrd.base_dir / "runc"), "--fifo-dir", str(ctrd.fifo_dir)]
        log.info("containers run in a private containerd node=%s runtime=%s", settings.name,
                 runtime or "runc")  # fmt: skip
        return CtrRunner(command, base, runtime, flags)
    log.info("containers run in containerd socket=%s node=%s", mode, settings.name)
    runtime = runtime_binary(settings.runtime_binary)
    return CtrRunner(["ctr", "--address", mode, "-n", namespace], base, runtime)
