"""Cluster-level behaviour: namespaces, node watches, collections, seeding, the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest
from gpushare_sim.apiserver import Store, objects
from gpushare_sim.apiserver.kinds import PODS
from gpushare_sim.apiserver.namespaces import SYSTEM_NAMESPACES
from gpushare_sim.apiserver.selectors import parse_field_selector
from gpushare_sim.apiserver.store import Selection
from kubernetes import client, watch

from tests.support import kubeapi
from tests.support.kubeapi import KubeApi, client_for, pod_manifest

kube_api = kubeapi.kube_api
LIMIT = 10


@pytest.fixture
def core(kube_api: KubeApi) -> client.CoreV1Api:
    return client.CoreV1Api(kube_api.client)


def test_namespaces(core: client.CoreV1Api) -> None:
    system = sorted(n.metadata.name for n in core.list_namespace().items)
    assert system == ["default", "gpushare-system", "kube-node-lease", "kube-public", "kube-system"]
    created = core.create_namespace({"metadata": {"name": "team-a"}})
    assert created.status.phase == "Active" and created.spec.finalizers == ["kubernetes"]
    assert core.read_namespace("team-a").metadata.uid == created.metadata.uid
    core.delete_namespace("team-a")
    assert sorted(n.metadata.name for n in core.list_namespace().items) == system


def test_delete_collection_by_label(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_manifest("spot-1", labels={"spot": "yes"}))
    core.create_namespaced_pod("default", pod_manifest("spot-2", "node-1", labels={"spot": "yes"}))
    core.create_namespaced_pod("default", pod_manifest("keep"))
    core.delete_collection_namespaced_pod("default", label_selector="spot=yes")
    left = {p.metadata.name: p.metadata.deletion_timestamp for p in core.list_namespaced_pod("default").items}
    assert set(left) == {"keep", "spot-2"}  # the pod on a node is Terminating
    assert left["spot-2"] is not None and left["keep"] is None


def test_node_watch_sees_status_updates(core: client.CoreV1Api) -> None:
    version = core.list_node().metadata.resource_version
    core.create_node({"metadata": {"name": "node-1"}})
    core.patch_node_status("node-1", {"status": {"allocatable": {"gpushare/spot-gpu": "4"}}})
    core.delete_node("node-1")
    stream = watch.Watch().stream(core.list_node, resource_version=version, timeout_seconds=LIMIT)
    seen = []
    for event in stream:
        status = event["raw_object"].get("status") or {}
        seen.append((event["type"], status.get("allocatable", {})))
        if len(seen) == 3:
            break
    assert seen == [("ADDED", {}), ("MODIFIED", {"gpushare/spot-gpu": "4"}),
                    ("DELETED", {"gpushare/spot-gpu": "4"})]


def test_lease_times_round_trip(kube_api: KubeApi) -> None:
    leases = client.CoordinationV1Api(kube_api.client)
    now = datetime.now(UTC).replace(microsecond=123456)
    spec = client.V1LeaseSpec(holder_identity="a", acquire_time=now, renew_time=now,
                              lease_duration_seconds=15, lease_transitions=0)
    leases.create_namespaced_lease("gpushare-system", client.V1Lease(
        metadata=client.V1ObjectMeta(name="leader"), spec=spec))
    read = leases.read_namespaced_lease("leader", "gpushare-system")
    assert read.spec.renew_time == now
    patched = leases.patch_namespaced_lease(
        "leader", "gpushare-system", {"spec": {"holderIdentity": "b"}})
    assert patched.spec.holder_identity == "b" and patched.spec.acquire_time == now


def test_seeding_through_the_server_loop(kube_api: KubeApi, core: client.CoreV1Api) -> None:
    version = kube_api.seed("pods", "bulk", (pod_manifest(f"p{i}", f"node-{i % 4}") for i in range(200)))
    found = core.list_namespaced_pod("bulk", field_selector="spec.nodeName=node-1")
    assert len(found.items) == 50
    assert int(found.metadata.resource_version) == version
    kube_api.seed("nodes", "", [{"metadata": {"name": "node-1"}}])
    assert [n.metadata.name for n in core.list_node().items] == ["node-1"]


def test_node_indexed_watchers_get_only_their_pods() -> None:
    store = Store()
    mine, _ = store.watch(Selection(PODS, None, (), parse_field_selector("spec.nodeName=n1")), store.rv)
    other, _ = store.watch(Selection(PODS, None, (), parse_field_selector("spec.nodeName=n2")), store.rv)
    everything, _ = store.watch(Selection(PODS), store.rv)
    objects.create(store, PODS, "default", pod_manifest("a", "n1"))
    objects.create(store, PODS, "default", pod_manifest("b"))
    objects.bind(store, objects.Target(PODS, "default", "b"), "n1")
    objects.delete(store, objects.Target(PODS, "default", "a"), objects.DeleteOptions(grace_period=0))
    types = [json.loads(line)["type"] for line in mine.lines]
    assert types == ["ADDED", "ADDED", "DELETED"]
    assert not other.lines
    assert len(everything.lines) == 4
    for watcher in (mine, other, everything):
        store.unwatch(watcher)
    assert not any(store.watchers["pods"])


def test_cli_serves_and_writes_a_kubeconfig(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    process = subprocess.Popen(
        [sys.executable, "-m", "gpushare_sim.apiserver", "--port", "0", "--kubeconfig", str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()  # the "serving" line comes after the kubeconfig
        assert "serving url=http://127.0.0.1:" in line, line
        api = client_for(path)
        try:
            core = client.CoreV1Api(api)
            core.create_namespaced_pod("default", pod_manifest("p1"))
            assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == ["p1"]
        finally:
            api.close()
    finally:
        process.terminate()
        started = time.monotonic()
        assert process.wait(10) == 0
        assert time.monotonic() - started < 5


def test_lists_by_node_follow_binding_and_deletion(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_manifest("a", "n1"))
    core.create_namespaced_pod("default", pod_manifest("b"))

    def names(selector: str) -> list[str]:
        found = core.list_pod_for_all_namespaces(field_selector=selector).items
        return sorted(p.metadata.name for p in found)

    assert names("spec.nodeName=n1") == ["a"]
    assert names("spec.nodeName=") == ["b"]  # not scheduled yet
    binding = {"metadata": {"name": "b"}, "target": {"kind": "Node", "name": "n1"}}
    core.create_namespaced_pod_binding("b", "default", binding, _preload_content=False)
    assert names("spec.nodeName=n1") == ["a", "b"]
    assert names("spec.nodeName=n1,metadata.name!=a") == ["b"]
    assert names("spec.nodeName=") == []
    core.delete_namespaced_pod("a", "default", grace_period_seconds=0)
    assert names("spec.nodeName=n1") == ["b"]
    assert names("spec.nodeName!=n1") == []


def test_watch_from_a_future_version_skips_until_then() -> None:
    store = Store()
    watcher, first = store.watch(Selection(PODS), since=store.rv + 1)  # after "a"
    assert first == []
    for name in ("a", "b", "c"):
        objects.create(store, PODS, "default", pod_manifest(name))
    names = [json.loads(line)["object"]["metadata"]["name"] for line in watcher.lines]
    assert names == ["b", "c"]
    store.unwatch(watcher)


def test_status_endpoint(kube_api: KubeApi) -> None:
    kube_api.seed("pods", "default", [pod_manifest("p1"), pod_manifest("p2")])
    with urllib.request.urlopen(f"{kube_api.url}/status", timeout=LIMIT) as answer:
        status = json.loads(answer.read())
    system = len(SYSTEM_NAMESPACES)  # each with its default ServiceAccount
    assert status["objects"] == {"pods": 2, "namespaces": system, "serviceaccounts": system}
    assert status["resourceVersion"] == 2 * system + 3 and status["history"] == 2 * system + 2


def test_openapi_tells_kubectl_the_server_validates_fields(kube_api: KubeApi) -> None:
    with urllib.request.urlopen(f"{kube_api.url}/openapi/v3", timeout=LIMIT) as answer:
        index = json.loads(answer.read())
    url = index["paths"]["api/v1"]["serverRelativeURL"]
    with urllib.request.urlopen(f"{kube_api.url}{url}", timeout=LIMIT) as answer:
        document = json.loads(answer.read())
    patch = document["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}} in patch["parameters"]
    assert "apis/coordination.k8s.io/v1" in index["paths"]


def test_kubectl_apply_get_and_strict_fields(kube_api: KubeApi) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (optional: only this compatibility check uses it)")
    manifest = ("apiVersion: v1\nkind: Pod\nmetadata: {name: p1, labels: {app: web}}\n"
                "spec: {containers: [{name: main, image: busybox}]}\n")

    def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([kubectl, "--kubeconfig", str(kube_api.kubeconfig), *args],
                              input=stdin, capture_output=True, text=True, timeout=60, check=False)

    assert run("apply", "-f", "-", stdin=manifest).returncode == 0
    assert run("apply", "-f", "-", stdin=manifest.replace("web", "api")).returncode == 0
    labels = run("get", "pod", "p1", "-o", "jsonpath={.metadata.labels.app}")
    assert labels.stdout == "api"
    typo = run("create", "-f", "-", stdin=manifest.replace("p1", "p2").replace("image:", "imag:"))
    assert typo.returncode != 0 and 'unknown field "spec.containers[0].imag"' in typo.stderr
    assert run("delete", "pod", "p1", "--wait=false").returncode == 0
