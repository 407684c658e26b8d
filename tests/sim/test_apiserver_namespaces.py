"""Namespaces as a cluster has them: the system ones from the start, each with a
`default` ServiceAccount; objects need an existing, active namespace; deleting a
namespace empties it and it stays Terminating until its last pod is gone."""

from __future__ import annotations

import json

import pytest
from gpushare_sim.apiserver.namespaces import SYSTEM_NAMESPACES
from kubernetes import client, watch
from kubernetes.client import ApiException

from tests.support.kubeapi import KubeApi, pod_manifest


@pytest.fixture
def core(kube_api: KubeApi) -> client.CoreV1Api:
    return client.CoreV1Api(kube_api.client)


def refusal(error: pytest.ExceptionInfo[ApiException]) -> tuple[int, str, str]:
    body = json.loads(error.value.body)
    return error.value.status, body["reason"], body["message"]


def test_system_namespaces_and_their_accounts(core: client.CoreV1Api) -> None:
    assert sorted(n.metadata.name for n in core.list_namespace().items) == sorted(SYSTEM_NAMESPACES)
    accounts = core.list_service_account_for_all_namespaces().items
    assert sorted((a.metadata.namespace, a.metadata.name) for a in accounts) == sorted(
        (n, "default") for n in SYSTEM_NAMESPACES)  # fmt: skip
    assert core.create_namespaced_pod("default", pod_manifest("p")).spec.service_account_name == "default"


def test_objects_need_their_namespace(core: client.CoreV1Api) -> None:
    for create in (lambda: core.create_namespaced_pod("missing", pod_manifest("p")),
                   lambda: core.create_namespaced_event("missing", {"metadata": {"name": "e"},
                                                                    "involvedObject": {"kind": "Pod"}}),
                   lambda: core.create_namespaced_service_account("missing", {"metadata": {"name": "s"}})):  # fmt: skip
        with pytest.raises(ApiException) as error:
            create()
        assert refusal(error) == (404, "NotFound", 'namespaces "missing" not found')


def test_deletion_waits_for_pods_on_nodes(core: client.CoreV1Api) -> None:
    core.create_namespace({"metadata": {"name": "team"}})
    core.create_namespaced_pod("team", pod_manifest("running", node="node-1"))
    core.create_namespaced_pod("team", pod_manifest("unplaced"))
    core.create_namespaced_service_account("team", {"metadata": {"name": "robot"}})
    version = core.list_namespace().metadata.resource_version
    core.delete_namespace("team")
    terminating = core.read_namespace("team")
    assert terminating.status.phase == "Terminating" and terminating.metadata.deletion_timestamp is not None
    left = core.list_namespaced_pod("team").items
    assert [(p.metadata.name, p.metadata.deletion_timestamp is not None) for p in left] == [("running", True)]
    assert core.list_namespaced_service_account("team").items == []
    with pytest.raises(ApiException) as error:
        core.create_namespaced_pod("team", pod_manifest("late"))
    status, reason, message = refusal(error)
    assert (status, reason) == (403, "Forbidden") and "because it is being terminated" in message
    core.delete_namespaced_pod("running", "team", grace_period_seconds=0)  # the node confirms
    with pytest.raises(ApiException) as error:
        core.read_namespace("team")
    assert error.value.status == 404
    stream = watch.Watch().stream(core.list_namespace, resource_version=version, timeout_seconds=5)
    seen = []
    for event in stream:
        if event["object"].metadata.name == "team":
            seen.append((event["type"], event["object"].status.phase))
        if event["type"] == "DELETED":
            break
    assert seen == [("MODIFIED", "Terminating"), ("DELETED", "Terminating")]


def test_empty_namespace_goes_at_once_and_system_ones_stay(core: client.CoreV1Api) -> None:
    core.create_namespace({"metadata": {"name": "empty"}})
    core.delete_namespace("empty")
    assert "empty" not in [n.metadata.name for n in core.list_namespace().items]
    for name in ("default", "kube-system", "kube-public"):
        with pytest.raises(ApiException) as error:
            core.delete_namespace(name)
        assert refusal(error)[:2] == (403, "Forbidden")
    core.delete_namespace("kube-node-lease")  # allowed, as on a cluster
