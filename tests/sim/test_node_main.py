"""``python -m gpushare_sim.node`` as a process: HTTP /healthz, /status,
kubelet restart, card health, and the exporter's /metrics; clean exit on SIGTERM."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from gpushare_sim.node.testing import pod_manifest, short_sim_dir
from gpushare_sim.run.procs import wait_ports

from tests.support.kubeapi import kube_api  # noqa: F401  (the fixture)


def fetch(url: str, method: str = "GET") -> Any:
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=5) as response:
        body = response.read().decode()
    return json.loads(body) if body.startswith("{") else body


def wait_for(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"node simulator exited with {proc.returncode}")
        try:
            return fetch(url)
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"{url} did not answer within {timeout}s")


@pytest.fixture
def node_process() -> Iterator[tuple[str, str, subprocess.Popen[bytes], Path]]:
    sim_dir = short_sim_dir()
    args = [sys.executable, "-m", "gpushare_sim.node", "--name", "m1", "--dir", str(sim_dir),
            "--gpus", "2", "--port", "0", "--exporter-port", "0", "--ports-dir", str(sim_dir),
            "--containerd", "none"]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        ports = wait_ports(sim_dir, proc)
        yield ports["http"][0], ports["exporter"][0], proc, sim_dir
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        shutil.rmtree(sim_dir, ignore_errors=True)


def test_node_process_serves_health_status_metrics_and_restarts_kubelet(
    node_process: tuple[str, str, subprocess.Popen[bytes], Path],
) -> None:
    base, metrics, proc, sim_dir = node_process
    assert wait_for(f"{base}/healthz", proc)["alive"] is True
    deadline = time.monotonic() + 15
    while fetch(f"{base}/status")["devices"]["resources"].get("nvidia.com/gpu") is None:
        assert time.monotonic() < deadline, "cards never advertised"
        time.sleep(0.05)
    status = fetch(f"{base}/status")
    assert status["runner"] == "process"
    assert status["node_status"]["allocatable"]["nvidia.com/gpu"] == "2"
    assert fetch(f"{base}/kubelet/restart", "POST")["restarts"] == 1
    fetch(f"{base}/gpus/1/health?healthy=false", "POST")
    while fetch(f"{base}/status")["node_status"]["allocatable"].get("nvidia.com/gpu") != "1":
        assert time.monotonic() < deadline + 15, "card 1 never turned unhealthy"
        time.sleep(0.05)
    proc.send_signal(signal.SIGHUP)
    while fetch(f"{base}/status")["kubelet_restarts"] != 2:
        assert time.monotonic() < deadline + 15, "SIGHUP did not restart the kubelet"
        time.sleep(0.05)
    endpoints = json.loads((sim_dir / "m1" / "endpoints.json").read_text())
    assert endpoints["exporter"] == f"{metrics}/metrics" and endpoints["http"] == base
    assert endpoints["containerd_kind"] == "process"
    text = fetch(f"{metrics}/metrics")
    assert text.count("DCGM_FI_DEV_GPU_UTIL{") == 2
    assert (sim_dir / "m1" / "dev" / "nvidia1").exists()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    assert not (sim_dir / "m1" / "device-plugins" / "kubelet.sock").exists()


def test_node_process_with_api_and_scheduler_runs_and_removes_a_pod(kube_api: Any) -> None:  # noqa: F811
    sim_dir = short_sim_dir()
    args = [sys.executable, "-m", "gpushare_sim.node", "--name", "m2", "--dir", str(sim_dir),
            "--gpus", "1", "--port", "0", "--ports-dir", str(sim_dir), "--containerd", "none", "--schedule",
            "--api", str(kube_api.kubeconfig)]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    core = kubernetes.client.CoreV1Api(kube_api.client)
    try:
        wait_for(f"{wait_ports(sim_dir, proc)['http'][0]}/healthz", proc)
        body = pod_manifest("w", ["gpuload", "--util", "5"], resources={"nvidia.com/gpu": "1"})
        core.create_namespaced_pod("default", body, _preload_content=False)
        pod = poll(lambda: _pod(core, "w"), lambda p: _phase(p) == "Running", "pod w running")
        assert pod["spec"]["nodeName"] == "m2"
        leases = kubernetes.client.CoordinationV1Api(kube_api.client)
        lease = poll(lambda: _lease(leases, "m2"), lambda found: found is not None, "node m2's lease")
        assert lease.spec.holder_identity == "m2" and lease.spec.renew_time is not None
        core.delete_namespaced_pod("w", "default", _preload_content=False)
        poll(lambda: _pod(core, "w"), lambda p: p is None, "pod w removed")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        shutil.rmtree(sim_dir, ignore_errors=True)


def _pod(core: Any, name: str) -> dict[str, Any] | None:
    try:
        return dict(json.loads(core.read_namespaced_pod(name, "default",
                                                        _preload_content=False).data))  # fmt: skip
    except kubernetes.client.exceptions.ApiException as err:
        if err.status == 404:
            return None
        raise


def _lease(leases: Any, name: str) -> Any:
    try:
        return leases.read_namespaced_lease(name, "kube-node-lease")
    except kubernetes.client.exceptions.ApiException as err:
        if err.status == 404:
            return None
        raise


def _phase(pod: dict[str, Any] | None) -> str:
    return str(((pod or {}).get("status") or {}).get("phase", ""))


def poll(get: Any, done: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = get()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
