"""The workload program (sim/tools/gpuload.c): arguments, the kernel stand-in's
permission protocol (one JSON line each way, reply held while blocked), the
utilisation report, path translation for plain processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from gpushare_sim.node.adapters.backend import BackendError, ensure_gpuload
from gpushare_sim.node.testing import short_sim_dir, wait_until

from tests.sim.test_node_kubelet import TOOLS


@pytest.fixture(scope="module")
def gpuload() -> Path:
    try:
        return ensure_gpuload(TOOLS)
    except BackendError as err:
        pytest.fail(str(err))


@pytest.mark.parametrize(
    "args",
    [["--util", "101"], ["--every-ms", "0"], ["--bogus", "1"], ["--util"], ["--util", "5x"],
     ["--dev", "/nonexistent/nvidia0"]],
)  # fmt: skip
def test_bad_arguments_fail_clearly(gpuload: Path, args: list[str]) -> None:
    result = subprocess.run([str(gpuload), *args, "--once"], capture_output=True, text=True,
                            env={"GPULOAD_PATH_MAP": "/dev/nvidia0=/dev/null"}, check=False)  # fmt: skip
    assert result.returncode in (1, 2)
    assert result.stderr.startswith("gpuload:")


def test_path_map_and_report(gpuload: Path, tmp_path: Path) -> None:
    env = {"GPULOAD_PATH_MAP": f"/dev/nvidia2=/dev/null;/run/r={tmp_path}",
           "GPULOAD_REPORT_DIR": "/run/r"}  # fmt: skip
    args = [str(gpuload), "--util", "30", "--mem-mib", "7", "--count", "3", "--every-ms", "1"]
    subprocess.run(args, env=env, check=True, capture_output=True)
    report = json.loads((tmp_path / "nvidia2.json").read_text())
    assert report["dev"] == "nvidia2" and report["util"] == 30 and report["mem_mib"] == 7
    assert report["ioctls"] == 3 and report["blocked_ms"] == 0


async def test_permission_is_asked_before_each_ioctl_and_the_reply_can_be_held(
    gpuload: Path, tmp_path: Path
) -> None:
    sim_dir = short_sim_dir()
    sock = sim_dir / "kmod.sock"
    requests: list[dict[str, Any]] = []
    release = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(json.loads(await reader.readline()))
        await release.wait()
        writer.write(b'{"blocked_ms": 12.5}\n')
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(serve, path=str(sock))
    env = {"GPULOAD_PATH_MAP": "/dev/nvidia0=/dev/null", "GPULOAD_KMOD_SOCK": str(sock),
           "GPULOAD_REPORT_DIR": str(tmp_path)}  # fmt: skip
    proc = await asyncio.create_subprocess_exec(str(gpuload), "--once", env=env,
                                                stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        await wait_until(lambda: requests, what="permission request")
        assert requests[0]["type"] == 0x46 and requests[0]["pid"] == proc.pid
        assert requests[0]["pidns"] == os.stat("/proc/self/ns/pid").st_ino
        assert proc.returncode is None and not (tmp_path / "nvidia0.json").exists()
        release.set()
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        report = json.loads((tmp_path / "nvidia0.json").read_text())
        assert report["blocked_ms"] == 12.5 and report["ioctls"] == 1
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        server.close()
        await server.wait_closed()
        sock.unlink(missing_ok=True)
        sim_dir.rmdir()


def test_sigterm_removes_the_report(gpuload: Path, tmp_path: Path) -> None:
    env = {"GPULOAD_PATH_MAP": "/dev/nvidia0=/dev/null", "GPULOAD_REPORT_DIR": str(tmp_path)}
    proc = subprocess.Popen([str(gpuload), "--every-ms", "20"], env=env,
                            stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith(b"gpuload: dev=")
        report = tmp_path / "nvidia0.json"
        deadline = time.monotonic() + 10
        while not report.exists():
            assert time.monotonic() < deadline, "no report written"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        assert not report.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
