"""Contract tests: the official Kubernetes client against the API emulator."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tests.support import kubeapi
from tests.support.kubeapi import KubeApi, pod_manifest

kube_api = kubeapi.kube_api

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


@pytest.fixture
def core(kube_api: KubeApi) -> client.CoreV1Api:
    kube_api.namespaces("team-a", "a", "b")
    return client.CoreV1Api(kube_api.client)


@pytest.fixture
def leases(kube_api: KubeApi) -> client.CoordinationV1Api:
    return client.CoordinationV1Api(kube_api.client)


def status_of(error: pytest.ExceptionInfo[ApiException]) -> dict[str, Any]:
    import json

    body: dict[str, Any] = json.loads(error.value.body)
    assert body["kind"] == "Status"
    assert body["code"] == error.value.status
    return body


def test_create_fills_server_fields(core: client.CoreV1Api) -> None:
    pod = core.create_namespaced_pod("team-a", pod_manifest("p1"))
    assert pod.metadata.namespace == "team-a"
    assert pod.metadata.uid and pod.metadata.creation_timestamp
    assert int(pod.metadata.resource_version) > 0
    assert pod.status.phase == "Pending"
    assert pod.status.qos_class == "BestEffort"
    again = core.read_namespaced_pod("p1", "team-a")
    assert again.metadata.uid == pod.metadata.uid


def test_generate_name_and_already_exists(core: client.CoreV1Api) -> None:
    body = pod_manifest("")
    body["metadata"] = {"generateName": "shadow-"}
    first = core.create_namespaced_pod("default", body)
    second = core.create_namespaced_pod("default", body)
    assert first.metadata.name.startswith("shadow-")
    assert first.metadata.name != second.metadata.name
    with pytest.raises(ApiException) as error:
        core.create_namespaced_pod("default", pod_manifest(first.metadata.name))
    assert error.value.status == 409
    assert status_of(error)["reason"] == "AlreadyExists"


def test_list_with_selectors(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("a", pod_manifest("p1", "node-1", {"app": "x", "tier": "web"}))
    core.create_namespaced_pod("a", pod_manifest("p2", "node-2", {"app": "x"}))
    core.create_namespaced_pod("b", pod_manifest("p3", "node-1", {"app": "y"}))

    def names(**kwargs: Any) -> list[str]:
        found = core.list_pod_for_all_namespaces(**kwargs).items
        return sorted(pod.metadata.name for pod in found)

    assert names() == ["p1", "p2", "p3"]
    assert names(field_selector="spec.nodeName=node-1") == ["p1", "p3"]
    assert names(field_selector="spec.nodeName!=node-1,metadata.namespace=a") == ["p2"]
    assert names(label_selector="app=x,tier") == ["p1"]
    assert names(label_selector="app in (x, y),!tier") == ["p2", "p3"]
    assert names(field_selector="status.phase=Pending", label_selector="app notin (x)") == ["p3"]
    assert [p.metadata.name for p in core.list_namespaced_pod("b").items] == ["p3"]


def test_list_pages_with_limit_and_continue(core: client.CoreV1Api) -> None:
    for index in range(5):
        core.create_namespaced_pod("default", pod_manifest(f"p{index}"))
    first = core.list_namespaced_pod("default", limit=2)
    assert [p.metadata.name for p in first.items] == ["p0", "p1"]
    assert first.metadata.remaining_item_count == 3
    rest = core.list_namespaced_pod("default", limit=10, _continue=first.metadata._continue)
    assert [p.metadata.name for p in rest.items] == ["p2", "p3", "p4"]
    assert not rest.metadata._continue


def test_patch_kinds(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_manifest("p1", labels={"keep": "1", "drop": "1"}))
    merged = core.patch_namespaced_pod(
        "p1", "default", {"metadata": {"labels": {"drop": None}, "annotations": {"a": "1"}}},
        _content_type=MERGE,
    )
    assert merged.metadata.labels == {"keep": "1"}
    assert merged.metadata.annotations == {"a": "1"}
    strategic = core.patch_namespaced_pod(
        "p1", "default", {"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}}
    )
    assert [(c.name, c.image) for c in strategic.spec.containers] == [("main", "busybox:2")]
    ops = [{"op": "add", "path": "/metadata/annotations/b", "value": "2"},
           {"op": "remove", "path": "/metadata/annotations/a"}]
    patched = core.patch_namespaced_pod("p1", "default", ops)
    assert patched.metadata.annotations == {"b": "2"}


def test_status_subresource_merges_conditions_by_type(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_manifest("shadow", "node-1"))
    conditions = [{"type": "gpushare.k8s.io/Using", "status": "True", "reason": "dev-0"}]
    core.patch_namespaced_pod_status("shadow", "default", {"status": {"conditions": conditions}})
    ready = [{"type": "Ready", "status": "True"}]
    pod = core.patch_namespaced_pod_status(
        "shadow", "default", {"status": {"phase": "Running", "conditions": ready}}
    )
    assert pod.status.phase == "Running"
    assert sorted(c.type for c in pod.status.conditions) == ["Ready", "gpushare.k8s.io/Using"]
    # the main resource ignores status, the status subresource ignores everything else
    pod = core.patch_namespaced_pod(
        "shadow", "default", {"status": {"phase": "Failed"}}, _content_type=MERGE
    )
    assert pod.status.phase == "Running"
    pod = core.patch_namespaced_pod_status(
        "shadow", "default", {"metadata": {"labels": {"x": "y"}}}, _content_type=MERGE
    )
    assert not pod.metadata.labels


def test_replace_with_stale_version_conflicts(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod_manifest("p1"))
    current = core.patch_namespaced_pod("p1", "default", {"metadata": {"labels": {"v": "2"}}})
    created.metadata.labels = {"v": "stale"}
    with pytest.raises(ApiException) as error:
        core.replace_namespaced_pod("p1", "default", created)
    assert error.value.status == 409
    assert status_of(error)["reason"] == "Conflict"
    current.metadata.labels = {"v": "3"}
    replaced = core.replace_namespaced_pod("p1", "default", current)
    assert replaced.metadata.labels == {"v": "3"}
    stale_patch = {"metadata": {"resourceVersion": created.metadata.resource_version}}
    with pytest.raises(ApiException) as error:
        core.patch_namespaced_pod("p1", "default", stale_patch, _content_type=MERGE)
    assert error.value.status == 409


def test_delete_pod_without_node_is_immediate(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_manifest("p1"))
    core.delete_namespaced_pod("p1", "default")
    with pytest.raises(ApiException) as error:
        core.read_namespaced_pod("p1", "default")
    assert error.value.status == 404
    assert status_of(error)["reason"] == "NotFound"


def test_delete_pod_on_node_waits_for_the_node(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_manifest("p1", "node-1"))
    terminating = core.delete_namespaced_pod("p1", "default", grace_period_seconds=20)
    assert terminating.metadata.deletion_timestamp is not None
    assert terminating.metadata.deletion_grace_period_seconds == 20
    assert core.read_namespaced_pod("p1", "default").metadata.deletion_timestamp is not None
    again = core.delete_namespaced_pod("p1", "default")  # still terminating
    assert again.metadata.deletion_grace_period_seconds == 20
    core.delete_namespaced_pod("p1", "default", body=client.V1DeleteOptions(grace_period_seconds=0))
    assert core.list_namespaced_pod("default").items == []


def test_delete_with_uid_precondition(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_manifest("p1"))
    options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="other"))
    with pytest.raises(ApiException) as error:
        core.delete_namespaced_pod("p1", "default", body=options)
    assert error.value.status == 409


def test_binding_and_eviction(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_manifest("p1"))
    binding = client.V1Binding(
        metadata=client.V1ObjectMeta(name="p1"), target=client.V1ObjectReference(name="node-9")
    )
    core.create_namespaced_pod_binding("p1", "default", binding, _preload_content=False)
    assert core.read_namespaced_pod("p1", "default").spec.node_name == "node-9"
    with pytest.raises(ApiException) as error:
        core.create_namespaced_pod_binding("p1", "default", binding, _preload_content=False)
    assert error.value.status == 409
    eviction = client.V1Eviction(
        metadata=client.V1ObjectMeta(name="p1", namespace="default"),
        delete_options=client.V1DeleteOptions(grace_period_seconds=0),
    )
    core.create_namespaced_pod_eviction("p1", "default", eviction)
    assert core.list_namespaced_pod("default").items == []


def test_nodes_with_status(core: client.CoreV1Api) -> None:
    node = {"metadata": {"name": "node-1", "labels": {"gpu": "yes"}},
            "status": {"capacity": {"nvidia.com/gpu": "8"}}}
    created = core.create_node(node)
    assert created.status.capacity == {"nvidia.com/gpu": "8"}
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    patched = core.patch_node_status("node-1", ready)
    assert patched.status.conditions[0].type == "Ready"
    assert patched.status.capacity == {"nvidia.com/gpu": "8"}
    assert [n.metadata.name for n in core.list_node(label_selector="gpu=yes").items] == ["node-1"]
    core.delete_node("node-1")
    assert core.list_node().items == []


def test_events_create_and_list(core: client.CoreV1Api) -> None:
    for name, pod in (("e1", "p1"), ("e2", "p2")):
        event = {
            "metadata": {"name": name},
            "involvedObject": {"kind": "Pod", "name": pod, "namespace": "default"},
            "reason": "Evicted",
            "message": "owner back",
            "type": "Warning",
        }
        core.create_namespaced_event("default", event)
    found = core.list_namespaced_event("default", field_selector="involvedObject.name=p2")
    assert [e.metadata.name for e in found.items] == ["e2"]
    assert len(core.list_event_for_all_namespaces(field_selector="reason=Evicted").items) == 2


def test_lease_leader_election_cycle(leases: client.CoordinationV1Api) -> None:
    body = client.V1Lease(
        metadata=client.V1ObjectMeta(name="shadow-controller"),
        spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15),
    )
    created = leases.create_namespaced_lease("gpushare-system", body)
    read = leases.read_namespaced_lease("shadow-controller", "gpushare-system")
    read.spec.holder_identity = "b"
    taken = leases.replace_namespaced_lease("shadow-controller", "gpushare-system", read)
    assert taken.spec.holder_identity == "b"
    created.spec.holder_identity = "c"  # a stale read loses the race
    with pytest.raises(ApiException) as error:
        leases.replace_namespaced_lease("shadow-controller", "gpushare-system", created)
    assert error.value.status == 409
    with pytest.raises(ApiException) as error:
        leases.create_namespaced_lease("gpushare-system", body)
    assert error.value.status == 409
    leases.delete_namespaced_lease("shadow-controller", "gpushare-system")
    assert leases.list_namespaced_lease("gpushare-system").items == []


def test_discovery_and_version(kube_api: KubeApi) -> None:
    versions = client.CoreApi(kube_api.client).get_api_versions()
    assert versions.versions == ["v1"]
    resources = client.CoreV1Api(kube_api.client).get_api_resources()
    names = {r.name for r in resources.resources}
    assert {"pods", "pods/status", "nodes", "nodes/status", "events"} <= names
    groups = client.ApisApi(kube_api.client).get_api_versions()
    assert "coordination.k8s.io" in [g.name for g in groups.groups]
    lease_resources = client.CoordinationV1Api(kube_api.client).get_api_resources()
    assert [r.name for r in lease_resources.resources] == ["leases"]
    assert client.VersionApi(kube_api.client).get_code().major == "1"
