"""resource.k8s.io kinds: DeviceClass, ResourceSlice, ResourceClaim (+status),
ResourceClaimTemplate (v1) and DeviceTaintRule (v1alpha3) — storage, watch, patch,
status and selector semantics as for pods, discovery for kubectl."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tests.sim.kubectl import Kubectl, table
from tests.support.kubeapi import KubeApi

DRIVER = "gpushare.k8s.io"


@pytest.fixture
def resource(kube_api: KubeApi) -> client.ResourceV1Api:
    return client.ResourceV1Api(kube_api.client)


def resource_slice(name: str, node: str, driver: str = DRIVER, devices: int = 1) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                  "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}},
                                  "capacity": {"shares": {"value": "100"}}, "allowMultipleAllocations": True}
                                 for i in range(devices)]}}  # fmt: skip


def claim(name: str) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": "share.gpushare.k8s.io",
                                          "capacity": {"requests": {"shares": "25"}}}}  # fmt: skip
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [request]}}}  # fmt: skip


def test_slices_by_node_and_driver(resource: client.ResourceV1Api) -> None:
    resource.create_resource_slice(resource_slice("n1-gpus", "node-1", devices=2))
    resource.create_resource_slice(resource_slice("n2-gpus", "node-2"))
    resource.create_resource_slice(resource_slice("n1-nics", "node-1", driver="nic.example.com"))

    def names(**selectors: str) -> list[str]:
        return sorted(s.metadata.name for s in resource.list_resource_slice(**selectors).items)

    assert names(field_selector="spec.nodeName=node-1") == ["n1-gpus", "n1-nics"]
    assert names(field_selector=f"spec.driver={DRIVER}") == ["n1-gpus", "n2-gpus"]
    assert names(field_selector=f"spec.nodeName=node-1,spec.driver={DRIVER}") == ["n1-gpus"]
    with pytest.raises(ApiException) as error:
        resource.list_resource_slice(field_selector="spec.pool.name=x")
    assert error.value.status == 400 and "field label not supported" in error.value.body
    stored = resource.read_resource_slice("n1-gpus")
    assert stored.spec.devices[1].capacity["shares"].value == "100"


def test_slice_validation(kube_api: KubeApi, resource: client.ResourceV1Api) -> None:
    body = resource_slice("bad", "node-1")
    del body["spec"]["driver"], body["spec"]["nodeName"]
    request = urllib.request.Request(f"{kube_api.url}/apis/resource.k8s.io/v1/resourceslices", method="POST",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(request, timeout=10)
    status = json.loads(error.value.read())
    assert error.value.code == 422 and {c["field"] for c in status["details"]["causes"]} == {"spec.driver", "spec"}
    resource.create_resource_slice(resource_slice("good", "node-1"))
    with pytest.raises(ApiException) as error:
        resource.patch_resource_slice("good", {"spec": {"nodeName": "node-2"}})
    assert error.value.status == 422 and "spec.nodeName: field is immutable" in error.value.body


def test_claim_status_subresource_and_immutable_spec(resource: client.ResourceV1Api) -> None:
    created = resource.create_namespaced_resource_claim("default", claim("c1"))
    allocation = {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": "gpu-0",
                                           "consumedCapacity": {"shares": "25"}}]}}  # fmt: skip
    ignored = resource.patch_namespaced_resource_claim("c1", "default", {"status": {"allocation": allocation}})
    assert ignored.status is None or ignored.status.allocation is None  # the main resource ignores status
    done = resource.patch_namespaced_resource_claim_status("c1", "default", {"status": {"allocation": allocation}})
    assert done.status.allocation.devices.results[0].device == "gpu-0"
    assert done.metadata.generation == created.metadata.generation  # status writes keep the generation
    with pytest.raises(ApiException) as error:
        resource.patch_namespaced_resource_claim("c1", "default", {"spec": {"devices": {"requests": []}}})
    assert error.value.status == 422 and "field is immutable" in error.value.body
    labelled = resource.patch_namespaced_resource_claim("c1", "default", {"metadata": {"labels": {"a": "b"}}})
    assert labelled.metadata.labels == {"a": "b"}
    with pytest.raises(ApiException) as error:
        resource.create_namespaced_resource_claim("nowhere", claim("c2"))
    assert error.value.status == 404


def test_claim_watch_sees_allocation(kube_api: KubeApi, resource: client.ResourceV1Api) -> None:
    version = resource.list_namespaced_resource_claim("default").metadata.resource_version
    resource.create_namespaced_resource_claim("default", claim("watched"))
    resource.patch_namespaced_resource_claim_status("watched", "default", {"status": {"reservedFor": [
        {"resource": "pods", "name": "p", "uid": "u-1"}]}})  # fmt: skip
    resource.delete_namespaced_resource_claim("watched", "default")
    # raw: the official client's watch looks for a model named V1ResourceClaim, which it lacks
    url = (f"{kube_api.url}/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
           f"?watch=1&resourceVersion={version}&timeoutSeconds=5")  # fmt: skip
    with urllib.request.urlopen(url, timeout=10) as stream:
        events = [json.loads(line) for line in stream]
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert events[1]["object"]["status"]["reservedFor"][0]["uid"] == "u-1"


def test_classes_templates_and_taint_rules(kube_api: KubeApi, resource: client.ResourceV1Api) -> None:
    resource.create_device_class({"metadata": {"name": "share.gpushare.k8s.io"}, "spec": {"selectors": [
        {"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}})  # fmt: skip
    template = {"metadata": {"name": "quarter"}, "spec": {"spec": claim("x")["spec"]}}
    resource.create_namespaced_resource_claim_template("default", template)
    with pytest.raises(ApiException) as error:
        change = {"spec": {"spec": {"devices": {"requests": []}}}}
        resource.patch_namespaced_resource_claim_template("quarter", "default", change)
    assert error.value.status == 422
    alpha = client.ResourceV1alpha3Api(kube_api.client)
    rule = {"metadata": {"name": "owner-back"}, "spec": {
        "deviceSelector": {"driver": DRIVER, "pool": "node-1", "device": "gpu-0"},
        "taint": {"key": "gpushare.k8s.io/owner-back", "effect": "NoExecute"}}}  # fmt: skip
    alpha.create_device_taint_rule(rule)
    assert alpha.read_device_taint_rule("owner-back").spec.taint.effect == "NoExecute"
    assert [c.metadata.name for c in resource.list_device_class().items] == ["share.gpushare.k8s.io"]


def test_discovery_and_kubectl(kubectl: Kubectl, resource: client.ResourceV1Api) -> None:
    groups = {g["name"]: g for g in json.loads(kubectl.ok("get", "--raw", "/apis"))["groups"]}
    versions = [v["version"] for v in groups["resource.k8s.io"]["versions"]]
    assert versions == ["v1", "v1alpha3"] and groups["resource.k8s.io"]["preferredVersion"]["version"] == "v1"
    resources = kubectl.ok("api-resources", "--api-group", "resource.k8s.io", "-o", "name").split()
    assert resources == ["deviceclasses.resource.k8s.io", "devicetaintrules.resource.k8s.io",
                         "resourceclaims.resource.k8s.io", "resourceclaimtemplates.resource.k8s.io",
                         "resourceslices.resource.k8s.io"]  # fmt: skip
    resource.create_resource_slice(resource_slice("n1-gpus", "node-1"))
    rows = table(kubectl.ok("get", "resourceslices"))
    assert [(r["NAME"], r["NODE"], r["DRIVER"], r["POOL"]) for r in rows] == [("n1-gpus", "node-1", DRIVER, "node-1")]
    kubectl.ok("apply", "-f", "-", stdin=json.dumps(claim("c1")))
    resource.patch_namespaced_resource_claim_status("c1", "default", {"status": {"allocation": {"devices": {}}}})
    claims = table(kubectl.ok("get", "resourceclaims"))
    assert [(r["NAME"], r["STATE"]) for r in claims] == [("c1", "allocated")]
    kubectl.ok("label", "resourceclaim", "c1", "team=ml")
    assert kubectl.ok("get", "resourceclaims", "-l", "team=ml", "-o", "name") == "resourceclaim.resource.k8s.io/c1\n"
    assert kubectl.ok("delete", "resourceslice", "n1-gpus") == 'resourceslice.resource.k8s.io "n1-gpus" deleted\n'
