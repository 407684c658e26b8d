"""The solver as a process (``python -m gpushare_solver``): settings from the environment, ready,
/status, a clean stop on SIGTERM; a bad setting is a clear error and exit code 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from gpushare_common.ports import listen
from gpushare_common.settings import NatsSettings

from tests.support.kubeapi import KubeApi
from tests.support.service import http_env, http_port


def env(nats: NatsSettings, kube_api: KubeApi, ports_dir: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, **http_env(ports_dir), "GPUSHARE_NODE_NAME": "node-p", "GPUSHARE_NATS_URL": nats.url,
            "GPUSHARE_NATS_ENSURE_LAYOUT": "true",
            "GPUSHARE_NATS_PREFIX": nats.prefix, "GPUSHARE_NATS_STREAM": nats.stream,
            "GPUSHARE_NATS_KV_PREFIX": nats.kv_prefix, "GPUSHARE_KUBE_KUBECONFIG": str(kube_api.kubeconfig),
            "GPUSHARE_SOLVER_CONTAINERD_ADDRESS": "/nonexistent/containerd.sock", **extra}


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return int(response.status), response.read()
    except OSError:
        return 0, b""


def test_process_starts_serves_status_and_stops_cleanly(nats_settings: NatsSettings, kube_api: KubeApi,
                                                        tmp_path: Path) -> None:  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "gpushare_solver"], env=env(nats_settings, kube_api, tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        port = http_port(tmp_path, proc)
        deadline = time.monotonic() + 30
        while get(port, "/readyz")[0] != 200:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the solver did not become ready"
            time.sleep(0.05)
        status = json.loads(get(port, "/status")[1])
        assert status["service"] == "solver" and status["node"] == "node-p"
        assert status["mapping"] == {} and status["evictions_in_flight"] == []
        assert b"gpushare_solver_evictions" in get(port, "/metrics")[1]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_bad_setting_exits_2_naming_the_variable(nats_settings: NatsSettings, kube_api: KubeApi,
                                                   tmp_path: Path) -> None:  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "gpushare_solver"], capture_output=True, text=True,
                            env=env(nats_settings, kube_api, tmp_path, GPUSHARE_SOLVER_KMOD_TIMEOUT_S="soon"),
                            timeout=30, check=False)
    assert result.returncode == 2
    assert "GPUSHARE_SOLVER_KMOD_TIMEOUT_S" in result.stderr


def test_a_port_in_use_ends_the_service_with_one_line_naming_it(nats_settings: NatsSettings, kube_api: KubeApi,
                                                                tmp_path: Path) -> None:  # fmt: skip
    holder = listen("127.0.0.1", 0)
    port = holder.getsockname()[1]
    try:
        result = subprocess.run([sys.executable, "-m", "gpushare_solver"], capture_output=True, text=True,
                                env=env(nats_settings, kube_api, tmp_path, GPUSHARE_HTTP_PORT=str(port)),
                                timeout=60, check=False)  # fmt: skip
    finally:
        holder.close()
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"gpushare-solver: cannot listen on 127.0.0.1:{port}: Address already in use"), last
