"""The node simulator as a kubelet for `kubectl logs` and `kubectl get events`: it records
its pods' lifecycle as core/v1 Events (coalescing repeats), keeps each container's
output and serves it to the API emulator, which proxies `pods/<name>/log` to it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from gpushare_sim.node.testing import pod_manifest, short_sim_dir
from kubernetes import client

from tests.sim.kubectl import Kubectl, table
from tests.support.kubeapi import KubeApi

T = TypeVar("T")
NODE = "logs-node"
LIMIT = 30.0


def until(probe: Callable[[], T | None], what: str, timeout: float = LIMIT) -> T:
    """Wait for `probe()` to return something truthy (checked every 50 ms), or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def node(kube_api: KubeApi) -> Iterator[subprocess.Popen[bytes]]:
    """A node simulator (plain-process containers, with the scheduler) registered with the emulator."""
    args = [sys.executable, "-m", "gpushare_sim.node", "--name", NODE, "--api", str(kube_api.kubeconfig),
            "--dir", str(short_sim_dir()), "--gpus", "0", "--port", "0",
            "--exporter-port", "0", "--containerd", "none", "--schedule"]  # fmt: skip
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    core = client.CoreV1Api(kube_api.client)

    def published() -> bool:
        nodes = core.list_node(field_selector=f"metadata.name={NODE}").items
        endpoints = nodes[0].status.daemon_endpoints if nodes and nodes[0].status else None
        return bool(endpoints and endpoints.kubelet_endpoint and endpoints.kubelet_endpoint.port)

    try:
        until(published, "the node to publish its kubelet endpoint")
        yield process
    finally:
        process.terminate()
        process.wait(30)


def run_pod(core: client.CoreV1Api, name: str, script: str, restart: str = "Never") -> Any:
    """A pod running `sh -c script` (an empty script: a program that does not exist)."""
    body = pod_manifest(name, ["sh", "-c", script] if script else ["/no/such/program"])
    body["spec"]["restartPolicy"] = restart
    return core.create_namespaced_pod("default", body)


def events_of(kubectl: Kubectl, pod: str) -> list[dict[str, str]]:
    return table(kubectl.ok("get", "events", "-o", "wide", "--field-selector", f"involvedObject.name={pod}"))


def test_logs_whole_tail_and_follow(node: Any, kubectl: Kubectl, kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client)
    run_pod(core, "talker", "echo one; echo two; echo three; sleep 1000")
    until(lambda: kubectl.run("logs", "talker").stdout == "one\ntwo\nthree\n", "three lines of log")
    assert kubectl.ok("logs", "talker", "--tail", "1") == "three\n"
    assert kubectl.ok("logs", "talker", "--tail", "0") == ""
    assert kubectl.ok("logs", "talker", "--limit-bytes", "5") == "one\nt"
    run_pod(core, "short", "echo start; sleep 0.3; echo end")
    until(lambda: core.read_namespaced_pod("short", "default").status.phase != "Pending", "short to start")
    assert kubectl.ok("logs", "-f", "short") == "start\nend\n"  # ends when the container exits
    error = kubectl.fails("logs", "talker", "--timestamps")
    assert "timestamps are not recorded" in error


def test_logs_of_the_previous_instance(node: Any, kubectl: Kubectl, kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client)
    run_pod(core, "crasher", "echo instance-$$; exit 3", restart="Always")

    def restarted() -> bool:
        statuses = core.read_namespaced_pod("crasher", "default").status.container_statuses or []
        return bool(statuses and statuses[0].restart_count >= 1)

    until(restarted, "a restart of crasher")
    previous = kubectl.ok("logs", "crasher", "--previous")
    assert previous.startswith("instance-") and previous.count("\n") == 1
    current = until(lambda: kubectl.run("logs", "crasher").stdout, "the new instance's output")
    assert current.startswith("instance-") and current != previous
    reasons = {e["REASON"]: e for e in events_of(kubectl, "crasher")}
    assert reasons["BackOff"]["TYPE"] == "Warning"
    assert "Back-off restarting failed container main in pod crasher_default" in reasons["BackOff"]["MESSAGE"]


def test_lifecycle_events_from_scheduler_and_kubelet(node: Any, kubectl: Kubectl, kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client)
    core.create_namespaced_pod("default", pod_manifest("sleeper", ["sleep", "1000"]))  # placed by the scheduler
    wanted = {"Scheduled", "Pulled", "Created", "Started"}

    def started() -> dict[str, dict[str, str]] | None:
        found = {e["REASON"]: e for e in events_of(kubectl, "sleeper")}
        return found if wanted <= set(found) else None

    seen = until(started, "the start events")
    assert seen["Scheduled"]["MESSAGE"] == f"Successfully assigned default/sleeper to {NODE}"
    assert seen["Scheduled"]["SOURCE"] == "default-scheduler"
    assert seen["Started"]["SOURCE"] == f"kubelet, {NODE}" and seen["Started"]["SUBOBJECT"] == "spec.containers{main}"
    assert seen["Pulled"]["MESSAGE"] == 'Container image "busybox" already present on machine'
    assert seen["Created"]["MESSAGE"] == "Created container: main"
    kubectl.ok("delete", "pod", "sleeper")
    killing = until(lambda: [e for e in events_of(kubectl, "sleeper") if e["REASON"] == "Killing"], "Killing")
    assert killing[0]["MESSAGE"] == "Stopping container main"
    described = kubectl.ok("describe", "node", NODE)
    assert "Ready" in described


def test_runtime_error_event_and_repeats_coalesced(node: Any, kubectl: Kubectl, kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client)
    run_pod(core, "broken", "", restart="Always")

    def failed_twice() -> list[dict[str, str]] | None:
        found = [e for e in events_of(kubectl, "broken") if e["REASON"] == "Failed"]
        return found if found and int(found[0]["COUNT"]) >= 2 else None

    failed = until(failed_twice, "a repeated Failed event")
    assert len(failed) == 1  # one Event object, counted
    assert failed[0]["TYPE"] == "Warning" and failed[0]["MESSAGE"].startswith("Error: cannot exec")
    assert "cannot exec ['/no/such/program']" in failed[0]["MESSAGE"]


def _log_error(kube_api: KubeApi, path: str) -> tuple[int, dict[str, Any]]:
    try:
        urllib.request.urlopen(f"{kube_api.url}{path}", timeout=10)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    pytest.fail(f"{path} was answered")


def test_log_requests_refused_clearly(node: Any, kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client)
    base = "/api/v1/namespaces/default/pods"
    assert _log_error(kube_api, f"{base}/ghost/log")[0] == 404
    core.create_namespaced_pod("default", pod_manifest("pair", ["sleep", "1000"], containers=["a", "b"]))
    code, status = _log_error(kube_api, f"{base}/pair/log")
    assert code == 400 and "a container name must be specified for pod pair, choose one of: [a b]" in status["message"]
    code, status = _log_error(kube_api, f"{base}/pair/log?container=c")
    assert code == 400 and status["message"] == "container c is not valid for pod pair"
    code, status = _log_error(kube_api, f"{base}/pair/log?container=a&tailLines=-1")
    assert code == 422 and "tailLines" in status["message"]
    unbound = pod_manifest("floating", ["sleep", "1"])
    unbound["spec"]["schedulerName"] = "nobody"  # never placed
    core.create_namespaced_pod("default", unbound)
    code, status = _log_error(kube_api, f"{base}/floating/log")
    assert code == 400 and status["message"] == "pod floating does not have a host assigned"
