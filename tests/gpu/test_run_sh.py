"""The prepared GPU check where there is no GPU: its skip line and JSON, its parsers, and a
rehearsal of its container plumbing with a stand-in card node."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gpushare_dra_driver.cards import Card
from gpushare_sim.fakegpu.vendor import MPS_STAND_IN

from tests.gpu import check, dra_check
from tests.gpu.strace import ioctl_types, request_type

HERE = Path(__file__).resolve().parent


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has an NVIDIA driver")
def test_without_a_gpu_it_skips_with_one_line_and_the_json_shape(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    done = subprocess.run([str(HERE / "run.sh"), str(out)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["gpu check skipped: nvidia-smi not found: no NVIDIA driver "
                                        "on this machine"]
    assert json.loads(out.read_text()) == {
        "version": 1, "skipped": "nvidia-smi not found: no NVIDIA driver on this machine",
        "ok": None, "gpu": None, "steps": {}}


STRACE = """\
4711  ioctl(3</dev/nvidiactl>, _IOC(_IOC_READ|_IOC_WRITE, 0x46, 0xd2, 0x48), 0x7ffd4a1c) = 0
4711  ioctl(3</dev/nvidiactl>, _IOC(_IOC_READ|_IOC_WRITE, 0x46, 0x2b, 0x30) <unfinished ...>
4712  <... ioctl resumed>, 0x7ffd4a1d) = 0
4711  ioctl(5</dev/nvidia0<char 195:0>>, _IOC(_IOC_READ|_IOC_WRITE, 'F', 0x4e, 0x38), 0x7f) = 0
4711  ioctl(6</dev/nvidia-uvm>, _IOWR(0x1, 0x2, 0x10), 0x7f) = 0
4711  ioctl(1</dev/pts/0>, TCGETS, {c_iflag=ICRNL}) = 0
4711  ioctl(7, _IOC(_IOC_NONE, 0x46, 0x1, 0), 0) = 0
"""


def test_strace_lines_give_ioctl_types_per_device() -> None:
    assert ioctl_types(STRACE) == {"/dev/nvidiactl": {0x46: 2}, "/dev/nvidia0": {0x46: 1},
                                   "/dev/nvidia-uvm": {0x1: 1}}


@pytest.mark.parametrize(("request_text", "kind"), [
    ("_IOC(_IOC_READ|_IOC_WRITE, 0x46, 0x2b, 0x30), 0x7f", 0x46), ("_IOWR('F', 0x1, 0x8)", 0x46),
    ("_IO(70, 1)", 70), ("TCGETS, {}", None), ("_IOC(_IOC_READ)", None), ("_IOR(0xzz, 1, 2)", None),
])
def test_request_types(request_text: str, kind: int | None) -> None:
    assert request_type(request_text) == kind


def test_the_workload_reports_a_missing_driver_as_json(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(HERE / "cuda_alloc.py"), "64"], capture_output=True,
                          text=True, timeout=60, check=False, env={"LD_LIBRARY_PATH": str(tmp_path)})
    if shutil.which("nvidia-smi") is None:
        assert done.returncode == 1
    found = json.loads(done.stdout.splitlines()[-1])
    assert set(found) == {"allocated_mib", "target_mib", "error"} and found["target_mib"] == 64


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runc") is None, reason="needs root and runc")
def test_rehearsal_of_the_container_plumbing(tmp_path: Path) -> None:
    """check.py's own containers with a stand-in card: the shadow gets the card through the
    vendor table, a capped share gets its devices, caps and the daemon's directories."""
    node = check.Node(tmp_path, 0, 16384)
    cards = Path(f"/run/gpushare-gpu-check-test-{os.getpid()}")  # not under the containers' nodev /tmp
    cards.mkdir()
    card = cards / "nvidia0"
    os.mknod(card, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    config = json.loads((tmp_path / "runtime.json").read_text())
    config["vendors"] = {"nvidia.com/gpu": {"env": ["NVIDIA_VISIBLE_DEVICES"], "isolation": "nvidia-mps",
                                            "device_nodes": [str(card.parent / "nvidia{id}")]}}
    (tmp_path / "runtime.json").write_text(json.dumps(config))
    try:
        shadow, host = node.shadow("touch /tmp/nvidia-mps/daemon-pipe; echo shadow-up; exec sleep 30")
        end = time.monotonic() + 20
        while "shadow-up" not in (tmp_path / "shadow.log").read_text() and time.monotonic() < end:
            time.sleep(0.1)
        assert (host / "pipe" / "daemon-pipe").exists()
        probe = (f"echo x > {card} && ls /tmp/nvidia-mps && echo $NVIDIA_VISIBLE_DEVICES "
                 "$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
        done = node.foreground("share", node.share("share", probe, held=2, capped=True))
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["daemon-pipe", "0", "50", "0=8192M"]
        assert node.state_of(shadow)["status"] == "running"
    finally:
        node.close()
        shutil.rmtree(cards)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runc") is None, reason="needs root and runc")
def test_rehearsal_of_the_dra_plumbing(tmp_path: Path) -> None:
    """The DRA step with a stand-in card and the sim's stand-in daemon: the driver's CDI specs
    reach the container through the runtime (its card, its caps, the node's MPS pipe with the
    daemon's control socket in it), and the daemon stops after the last claim."""
    node = check.Node(tmp_path, 0, 16384)
    cards = Path(f"/run/gpushare-gpu-check-dra-{os.getpid()}")
    cards.mkdir()
    card = cards / "nvidia0"
    os.mknod(card, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    config = json.loads((tmp_path / "runtime.json").read_text())
    config["vendors"] = {"nvidia.com/gpu": {"env": ["NVIDIA_VISIBLE_DEVICES"], "isolation": "nvidia-mps",
                                            "device_nodes": [str(card.parent / "nvidia{id}")]}}
    (tmp_path / "runtime.json").write_text(json.dumps(config))
    try:
        done, stopped = asyncio.run(_dra_probe(node, card))
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["control", "GPU-check-0", "25", "0=4096M"]
        assert stopped
    finally:
        node.close()
        shutil.rmtree(cards)


async def _dra_probe(node: check.Node, card: Path) -> tuple[subprocess.CompletedProcess[str], bool]:
    shares, refs, prepared, daemon = await dra_check.prepare_two(
        node.work, Card("GPU-check-0", "nvidia.com/gpu", 0, True, memory_mib=16384), check.NODE, MPS_STAND_IN)
    try:
        probe = (f"echo x > {card} && ls /tmp/nvidia-mps && echo $NVIDIA_VISIBLE_DEVICES "
                 "$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
        done = node.foreground("dra-a", node.dra_share("dra-a", prepared[refs[0].uid], probe))
    finally:
        stopped = await dra_check.release(shares, refs, daemon)
    return done, stopped
