"""A real kubectl (v1.33, from its wheel) against the API emulator: the everyday verbs
work as on a cluster — tables, -o wide/yaml/json/name, selectors, watch, describe,
apply, create, label, annotate, patch, delete, namespaces, service accounts, tokens."""

from __future__ import annotations

import json
import queue
import subprocess
import threading

import pytest
import yaml
from kubernetes import client

from tests.sim.kubectl import Kubectl, table
from tests.support.kubeapi import KubeApi, pod_manifest

POD = """
apiVersion: v1
kind: Pod
metadata:
  name: applied
  namespace: team
  labels: {app: demo}
spec:
  containers:
  - name: main
    image: busybox
    command: ["sleep", "1000"]
"""


@pytest.fixture
def core(kube_api: KubeApi) -> client.CoreV1Api:
    return client.CoreV1Api(kube_api.client)


def test_version_and_namespaces_as_on_a_new_cluster(kubectl: Kubectl) -> None:
    assert "Client Version: v1.33" in kubectl.ok("version")
    rows = table(kubectl.ok("get", "namespaces"))
    assert [r["NAME"] for r in rows] == ["default", "gpushare-system", "kube-node-lease", "kube-public", "kube-system"]
    assert {r["STATUS"] for r in rows} == {"Active"} and all(r["AGE"].endswith("s") for r in rows)


def test_create_namespace_sent_as_protobuf(kubectl: Kubectl, core: client.CoreV1Api) -> None:
    assert kubectl.ok("create", "namespace", "team") == "namespace/team created\n"
    assert core.read_namespace("team").spec.finalizers == ["kubernetes"]
    assert "AlreadyExists" in kubectl.fails("create", "namespace", "team")
    assert [a.metadata.name for a in core.list_namespaced_service_account("team").items] == ["default"]


def test_a_pod_needs_its_namespace(kubectl: Kubectl) -> None:
    error = kubectl.fails("run", "p", "--image=busybox", "-n", "nowhere")
    assert 'namespaces "nowhere" not found' in error


def test_get_pods_table_and_wide(kubectl: Kubectl, kube_api: KubeApi, core: client.CoreV1Api) -> None:
    kube_api.namespaces("team")
    core.create_namespaced_pod("team", pod_manifest("p1", node="node-1", labels={"app": "x"}))
    status = {"phase": "Running", "podIP": "10.0.0.7", "conditions": [{"type": "Ready", "status": "True"}],
              "containerStatuses": [{"name": "main", "image": "busybox", "imageID": "", "ready": True,
                                     "restartCount": 2, "state": {"running": {}}}]}  # fmt: skip
    core.patch_namespaced_pod_status("p1", "team", {"status": status})
    core.create_namespaced_pod("team", pod_manifest("p2"))
    rows = table(kubectl.ok("get", "pods", "-n", "team"))
    assert list(rows[0]) == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert [(r["NAME"], r["READY"], r["STATUS"], r["RESTARTS"]) for r in rows] == [
        ("p1", "1/1", "Running", "2"), ("p2", "0/1", "Pending", "0")]
    wide = table(kubectl.ok("get", "pods", "-n", "team", "-o", "wide"))
    assert list(wide[0]) == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE", "NOMINATED NODE",
                             "READINESS GATES"]  # fmt: skip
    assert (wide[0]["IP"], wide[0]["NODE"], wide[1]["NODE"]) == ("10.0.0.7", "node-1", "<none>")
    everywhere = table(kubectl.ok("get", "pods", "-A"))
    assert [(r["NAMESPACE"], r["NAME"]) for r in everywhere] == [("team", "p1"), ("team", "p2")]
    assert kubectl.ok("get", "all", "-n", "team", "-o", "name") == "pod/p1\npod/p2\n"


def test_output_formats_and_selectors(kubectl: Kubectl, kube_api: KubeApi, core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_manifest("web", labels={"tier": "web"}))
    core.create_namespaced_pod("default", pod_manifest("db", node="node-2", labels={"tier": "db"}))
    assert kubectl.ok("get", "pods", "-o", "name") == "pod/db\npod/web\n"
    assert kubectl.ok("get", "pods", "-l", "tier=web", "-o", "name") == "pod/web\n"
    assert kubectl.ok("get", "pods", "--field-selector", "spec.nodeName=node-2", "-o", "name") == "pod/db\n"
    document = json.loads(kubectl.ok("get", "pod", "web", "-o", "json"))
    assert document["kind"] == "Pod" and document["metadata"]["labels"] == {"tier": "web"}
    assert yaml.safe_load(kubectl.ok("get", "pod", "db", "-o", "yaml"))["spec"]["nodeName"] == "node-2"
    labels = table(kubectl.ok("get", "pods", "--show-labels"))
    assert {r["NAME"]: r["LABELS"] for r in labels} == {"db": "tier=db", "web": "tier=web"}
    assert "field label not supported" in kubectl.fails("get", "pods", "--field-selector", "spec.image=x")


def test_label_annotate_patch_delete(kubectl: Kubectl, core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_manifest("p"))
    assert kubectl.ok("label", "pod", "p", "tier=web") == "pod/p labeled\n"
    assert kubectl.ok("annotate", "pod", "p", "note=hello") == "pod/p annotated\n"
    assert kubectl.ok("patch", "pod", "p", "-p", '{"metadata":{"labels":{"extra":"1"}}}') == "pod/p patched\n"
    assert kubectl.ok("patch", "pod", "p", "--type=json",
                      "-p", '[{"op":"remove","path":"/metadata/labels/extra"}]') == "pod/p patched\n"  # fmt: skip
    meta = core.read_namespaced_pod("p", "default").metadata
    assert meta.labels == {"tier": "web"} and meta.annotations == {"note": "hello"}
    assert kubectl.ok("label", "pod", "p", "tier-") == "pod/p unlabeled\n"
    assert kubectl.ok("delete", "pod", "p") == 'pod "p" deleted\n'
    assert core.list_namespaced_pod("default").items == []


def test_apply_client_side(kubectl: Kubectl, core: client.CoreV1Api, kube_api: KubeApi) -> None:
    kube_api.namespaces("team")
    assert kubectl.ok("apply", "-f", "-", stdin=POD) == "pod/applied created\n"
    assert kubectl.ok("apply", "-f", "-", stdin=POD) == "pod/applied unchanged\n"
    changed = POD.replace("app: demo", "app: demo2")
    assert kubectl.ok("apply", "-f", "-", stdin=changed) == "pod/applied configured\n"
    pod = core.read_namespaced_pod("applied", "team")
    assert pod.metadata.labels == {"app": "demo2"}
    applied = json.loads(pod.metadata.annotations["kubectl.kubernetes.io/last-applied-configuration"])
    assert applied["metadata"]["labels"] == {"app": "demo2"}


def test_apply_server_side_owns_removes_and_conflicts(kubectl: Kubectl, core: client.CoreV1Api,
                                                      kube_api: KubeApi) -> None:  # fmt: skip
    kube_api.namespaces("team")
    both = POD.replace("app: demo", "app: demo, keep: 'yes'")
    assert kubectl.ok("apply", "--server-side", "-f", "-", stdin=both) == "pod/applied serverside-applied\n"
    assert kubectl.ok("apply", "--server-side", "-f", "-", stdin=POD) == "pod/applied serverside-applied\n"
    pod = core.read_namespaced_pod("applied", "team")
    assert pod.metadata.labels == {"app": "demo"}  # the field kubectl stopped applying is gone
    assert [(m.manager, m.operation) for m in pod.metadata.managed_fields] == [("kubectl", "Apply")]
    assert pod.metadata.managed_fields[0].fields_v1["f:metadata"] == {"f:labels": {"f:app": {}}}
    other = POD.replace("app: demo", "app: mine")
    error = kubectl.fails("apply", "--server-side", "--field-manager", "intruder", "-f", "-", stdin=other)
    assert 'Apply failed with 1 conflict: conflict with "kubectl": .metadata.labels.app' in error
    kubectl.ok("apply", "--server-side", "--field-manager", "intruder", "--force-conflicts", "-f", "-", stdin=other)
    assert core.read_namespaced_pod("applied", "team").metadata.labels == {"app": "mine"}


def test_describe_pod_and_node_with_events(kubectl: Kubectl, core: client.CoreV1Api) -> None:
    core.create_node({"metadata": {"name": "node-1", "labels": {"node-role.kubernetes.io/gpu": ""}}})
    pod = core.create_namespaced_pod("default", pod_manifest("p", node="node-1"))
    core.create_namespaced_event("default", {
        "metadata": {"name": "p.1"}, "reason": "Evicted", "message": "owner came back", "type": "Warning",
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "p", "uid": pod.metadata.uid},
        "source": {"component": "gpushare-solver"}, "count": 1})  # fmt: skip
    described = kubectl.ok("describe", "pod", "p")
    assert "Node:             node-1" in described and "Service Account:  default" in described
    assert "Evicted" in described and "owner came back" in described
    node = kubectl.ok("describe", "node", "node-1")
    assert "Roles:              gpu" in node and "default" in node and " p " in node
    rows = table(kubectl.ok("get", "nodes"))
    assert (rows[0]["NAME"], rows[0]["STATUS"], rows[0]["ROLES"]) == ("node-1", "Unknown", "gpu")
    events = table(kubectl.ok("get", "events"))
    assert [(e["TYPE"], e["REASON"], e["OBJECT"], e["MESSAGE"]) for e in events] == [
        ("Warning", "Evicted", "pod/p", "owner came back")]


def test_requests_default_to_limits_as_the_api_server_does(kubectl: Kubectl, core: client.CoreV1Api) -> None:
    """A container with limits only gets them as its requests (resource by resource; a request
    given stays), so ``kubectl describe`` and the scheduler see what they would on a cluster."""
    body = pod_manifest("lim", node="node-1")
    body["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "500m", "memory": "1Gi", "gpushare/share-gpu": "1"},
                                                  "requests": {"cpu": "100m"}}
    body["spec"]["initContainers"] = [{"name": "init", "image": "busybox", "resources": {"limits": {"memory": "64Mi"}}}]
    core.create_namespaced_pod("default", body)
    pod = core.read_namespaced_pod("lim", "default")
    assert pod.spec.containers[0].resources.requests == {"cpu": "100m", "memory": "1Gi", "gpushare/share-gpu": "1"}
    assert pod.spec.init_containers[0].resources.requests == {"memory": "64Mi"}
    assert pod.status.qos_class == "Burstable"
    kubectl.ok("label", "pod", "lim", "team=a")  # an update of a pod sent without the defaults
    described = kubectl.ok("describe", "pod", "lim")
    assert "Requests:" in described and "memory:              1Gi" in described


def test_watch_prints_changes(kubectl: Kubectl, core: client.CoreV1Api) -> None:
    process = subprocess.Popen(kubectl.argv("get", "pods", "-w"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout or []], daemon=True).start()
    try:
        core.create_namespaced_pod("default", pod_manifest("watched"))
        seen = [lines.get(timeout=20) for _ in range(2)]
        core.patch_namespaced_pod_status("watched", "default", {"status": {"phase": "Running"}})
        seen.append(lines.get(timeout=20))
    finally:
        process.terminate()
        process.wait(10)
    rows = table("".join(seen))
    assert [(r["NAME"], r["STATUS"]) for r in rows] == [("watched", "Pending"), ("watched", "Running")]


def test_cordon_and_drain_evict_through_protobuf(kubectl: Kubectl, core: client.CoreV1Api) -> None:
    core.create_node({"metadata": {"name": "node-1"}})
    core.create_namespaced_pod("default", pod_manifest("p", node="node-1"))
    assert kubectl.ok("cordon", "node-1") == "node/node-1 cordoned\n"
    assert table(kubectl.ok("get", "nodes"))[0]["STATUS"] == "Unknown,SchedulingDisabled"
    drained = kubectl.ok("drain", "node-1", "--force", "--grace-period=0", "--timeout=20s")
    assert "pod/p evicted" in drained and "node/node-1 drained" in drained
    assert core.list_namespaced_pod("default").items == []


def test_namespace_deletion_cascades(kubectl: Kubectl, core: client.CoreV1Api) -> None:
    kubectl.ok("create", "namespace", "gone")
    core.create_namespaced_pod("gone", pod_manifest("p"))
    kubectl.ok("create", "serviceaccount", "robot", "-n", "gone")
    assert kubectl.ok("delete", "namespace", "gone") == 'namespace "gone" deleted\n'
    assert "gone" not in kubectl.ok("get", "namespaces", "-o", "name")
    assert core.list_pod_for_all_namespaces(field_selector="metadata.namespace=gone").items == []
    assert "may not be deleted" in kubectl.fails("delete", "namespace", "default")


def test_service_accounts_and_tokens(kubectl: Kubectl, kube_api: KubeApi) -> None:
    kubectl.ok("create", "serviceaccount", "robot")
    rows = table(kubectl.ok("get", "serviceaccounts"))
    assert [(r["NAME"], r["SECRETS"]) for r in rows] == [("default", "0"), ("robot", "0")]
    token = kubectl.ok("create", "token", "robot", "--audience", "gpushare", "--duration", "20m").strip()
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
              "spec": {"token": token, "audiences": ["gpushare"]}}  # fmt: skip
    answer = json.loads(kubectl.ok("create", "-f", "-", "-o", "json", stdin=json.dumps(review)))
    assert answer["status"]["authenticated"] is True
    assert answer["status"]["user"]["username"] == "system:serviceaccount:default:robot"
