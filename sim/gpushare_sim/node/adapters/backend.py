"""Choosing how containers run: a private containerd (via the launcher in
``gpushare_sim.containerd``) or a given containerd socket, driven through its
CRI plugin as a kubelet does (the default) or with ``ctr run``; or plain
processes where there is no root or no containerd."""

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
from gpushare_sim.containerd_cri import CriConfig
from gpushare_sim.fakegpu.vendor import vendor_table
from gpushare_sim.node.adapters.cri import CriClient, CriError, CriMissing
from gpushare_sim.node.adapters.crirunner import CriRunner
from gpushare_sim.node.adapters.images import ImageError, ImageSpec, import_image
from gpushare_sim.node.adapters.rootfs import build_base, find_busybox
from gpushare_sim.node.adapters.runners import CtrRunner, ProcessRunner, Runner
from gpushare_sim.node.settings import NodeSimSettings

log = logging.getLogger("gpushare_sim.node.backend")

GPULOAD = "gpuload"
HOG = "hog"
PAUSE = "pause"
CRI_NAMESPACE = "k8s.io"  # where containerd's CRI plugin keeps its containers and images
PAUSE_IMAGE = "gpushare.local/pause:1"
NODE_IMAGE = "gpushare.local/sim-node:1"  # every pod's containers: busybox and the workload tools
CRI_READY_S = 60.0
RUNTIME_CONFIG_ENV = "GPUSHARE_RUNTIME_CONFIG"
RUNTIME_NAME = "gpushare-runtime"


class BackendError(Exception):
    """The requested container backend cannot be used here."""


def ensure_tool(tools_dir: Path, name: str) -> Path:
    """One of the static programs of ``tools_dir``, built with ``make -C tools_dir`` when missing."""
    binary = tools_dir / name
    if not binary.exists() and (tools_dir / "Makefile").exists() and shutil.which("make"):
        subprocess.run(["make", "-s", "-C", str(tools_dir)], check=False, capture_output=True)
    if not binary.exists():
        raise BackendError(f"{binary} is missing: run `make -C {tools_dir}` (needs gcc)")
    return binary


def ensure_gpuload(tools_dir: Path) -> Path:
    """The static workload program."""
    return ensure_tool(tools_dir, GPULOAD)


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
    runtime = runtime_binary(settings.runtime_binary)
    cri = settings.containerd_api == "cri"
    if mode == "auto":
        address = await _private_containerd(settings, runtime, cri, stack)
    else:
        address = Path(mode)
        log.info("containers run in containerd socket=%s node=%s api=%s", mode, settings.name,
                 settings.containerd_api)  # fmt: skip
    if cri:
        return await _cri_runner(settings, address, base, runtime, stack)
    command = ["ctr", "--address", str(address), "-n", settings.containerd_namespace]
    if mode != "auto":
        return CtrRunner(command, base, runtime)
    ctrd_dir = address.resolve().parent
    flags = ["--runc-root", str(ctrd_dir / "runc"), "--fifo-dir", str(ctrd_dir / "fifo")]
    return CtrRunner(command, base, runtime, flags)


async def _private_containerd(settings: NodeSimSettings, runtime: Path | None, cri: bool,
                              stack: AsyncExitStack) -> Path:  # fmt: skip
    """A containerd of this node's own (its CRI plugin on when ``cri``); the node's stable name for its socket."""
    env = None
    if runtime is not None:
        env = {**os.environ, RUNTIME_CONFIG_ENV: str(runtime_config(settings))}
    handler_binary = runtime or Path(shutil.which("runc") or "runc")
    ctrd = Containerd(env=env, cri=CriConfig(handler_binary, PAUSE_IMAGE) if cri else None)  # a short /tmp base
    await asyncio.to_thread(ctrd.start)
    stack.push_async_callback(asyncio.to_thread, ctrd.stop)
    _link(settings.node_dir / "containerd.sock", ctrd.address)
    log.info("containers run in a private containerd node=%s runtime=%s api=%s", settings.name,
             runtime or "runc", settings.containerd_api)  # fmt: skip
    return ctrd.address


async def _cri_runner(settings: NodeSimSettings, address: Path, base: Path, runtime: Path | None,
                      stack: AsyncExitStack) -> CriRunner:  # fmt: skip
    """The CRI runner, once containerd's CRI plugin answers and has the node's two images."""
    client = CriClient(str(address))
    client.open()
    where = {"address": str(address), "namespace": CRI_NAMESPACE, "runtime": str(runtime or "runc")}
    runner = CriRunner(client, NODE_IMAGE, settings.runtime_handler, settings.node_dir / "pods", where)
    stack.push_async_callback(runner.close)
    version = await _cri_ready(client, address)
    pause_root = await asyncio.to_thread(_pause_root, settings)
    ctr = ["ctr", "--address", str(address), "-n", CRI_NAMESPACE]
    for image in (ImageSpec(PAUSE_IMAGE, pause_root, (f"/{PAUSE}",)), ImageSpec(NODE_IMAGE, base)):
        try:
            await asyncio.to_thread(import_image, ctr, image, settings.node_dir)
            present = await client.image_present(image.name)
        except (ImageError, CriError) as err:
            raise BackendError(f"node {settings.name}: {err}") from err
        if not present:
            raise BackendError(f"node {settings.name}: image {image.name} imported, but the CRI does not list it")
    log.info("containers run through the CRI node=%s runtime=%s handler=%s", settings.name, version,
             settings.runtime_handler)  # fmt: skip
    return runner


def _pause_root(settings: NodeSimSettings) -> Path:
    """The pause image's file system: the sandbox's init and nothing else."""
    root = settings.node_dir / "pause-root"
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ensure_tool(settings.tools_dir, PAUSE), root / PAUSE)
    return root


async def _cri_ready(client: CriClient, address: Path) -> str:
    """The CRI's version, once the plugin is initialized (it answers "not initialized" until then)."""
    deadline = asyncio.get_running_loop().time() + CRI_READY_S
    while True:
        try:
            return await client.version()
        except CriMissing as err:
            raise BackendError(f"{err.reason}: enable containerd's io.containerd.grpc.v1.cri plugin (its log says "
                               "why it did not load), or run the node with --containerd-api ctr") from err
        except CriError as err:
            if asyncio.get_running_loop().time() > deadline:
                raise BackendError(f"containerd's CRI plugin on {address} did not answer in {CRI_READY_S} s: "
                                   f"{err.reason}") from err
        await asyncio.sleep(0.05)
