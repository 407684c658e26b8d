"""DRA rights per node, from the chart as ``helm template`` renders it with DRA on, evaluated with a
real CEL evaluator (tests/deploy/admission.py): RBAC lets every DRA driver write every node's
ResourceSlices and every solver create DeviceTaintRules for any device; the admission policies
narrow both to the node of the pod whose token made the request."""

from __future__ import annotations

import pytest

from tests.deploy.admission import Decision, Policies, Request
from tests.deploy.admission_requests import NS, SOLVER, solver_token
from tests.deploy.chart import render

DRA_DRIVER = f"system:serviceaccount:{NS}:gpushare-dra-driver"
DRIVER = "gpushare.k8s.io"


@pytest.fixture(scope="module")
def policies() -> Policies:
    return Policies(render({"dra": {"enabled": True}}))


def resource_slice(node: str | None, driver: str = DRIVER, pool: str = "") -> dict[str, object]:
    spec: dict[str, object] = {"driver": driver, "pool": {"name": pool or node or "all", "generation": 1,
                                                          "resourceSliceCount": 1}, "devices": []}
    if node is None:
        spec["allNodes"] = True
    else:
        spec["nodeName"] = node
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-slice"},
            "spec": spec}


def taint_rule(pool: str, device: str | None = "spot-gpu-0", driver: str = DRIVER) -> dict[str, object]:
    selector = {"driver": driver, "pool": pool, **({"device": device} if device else {})}
    return {"apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceTaintRule",
            "metadata": {"name": f"gpushare-owner-back-{pool}"},
            "spec": {"deviceSelector": selector, "taint": {"key": f"{DRIVER}/owner-back", "effect": "NoExecute"}}}


def on_slice(operation: str, user: str, new: dict[str, object] | None, old: dict[str, object] | None,
             node: str | None = "node-a") -> Request:
    return Request(operation, "", "slice", user, new, old, extra=solver_token(node) if node else {},
                   group="resource.k8s.io", resource="resourceslices", kind="ResourceSlice")


def on_rule(operation: str, new: dict[str, object] | None, old: dict[str, object] | None,
            node: str | None = "node-a") -> Request:
    return Request(operation, "", "rule", SOLVER, new, old, extra=solver_token(node) if node else {},
                   group="resource.k8s.io", version="v1alpha3", resource="devicetaintrules",
                   kind="DeviceTaintRule")


def denied(decision: Decision, policy: str) -> bool:
    return not decision.allowed and decision.policy == policy


def test_a_driver_writes_its_own_nodes_slice(policies: Policies) -> None:
    mine = resource_slice("node-a")
    assert policies.admit(on_slice("CREATE", DRA_DRIVER, mine, None)).allowed
    assert policies.admit(on_slice("UPDATE", DRA_DRIVER, mine, mine)).allowed
    assert policies.admit(on_slice("DELETE", DRA_DRIVER, None, mine)).allowed


@pytest.mark.parametrize(("operation", "new", "old"), [
    ("CREATE", resource_slice("node-b"), None),  # another node's devices, published by node A's driver
    ("UPDATE", resource_slice("node-a"), resource_slice("node-b")),  # taking over node B's slice
    ("UPDATE", resource_slice("node-b"), resource_slice("node-a")),
    ("DELETE", None, resource_slice("node-b")),  # node B's devices gone from the cluster
    ("CREATE", resource_slice(None), None),  # a slice for every node
    ("CREATE", resource_slice("node-a", driver="nvidia.com"), None),  # another driver's name
    ("CREATE", resource_slice("node-a", pool="node-b"), None),
], ids=["create-other", "update-from-other", "update-to-other", "delete-other", "all-nodes", "other-driver",
        "other-pool"])  # fmt: skip
def test_a_driver_touches_no_other_nodes_slice(policies: Policies, operation: str, new: dict[str, object] | None,
                                              old: dict[str, object] | None) -> None:
    assert denied(policies.admit(on_slice(operation, DRA_DRIVER, new, old)), "gpushare-dra-driver-own-node")


def test_a_driver_without_a_node_bound_token_is_refused(policies: Policies) -> None:
    decision = policies.admit(on_slice("CREATE", DRA_DRIVER, resource_slice("node-a"), None, node=None))
    assert denied(decision, "gpushare-dra-driver-own-node") and "names no node" in decision.message


def test_the_solver_taints_a_device_of_its_own_node(policies: Policies) -> None:
    mine = taint_rule("node-a")
    assert policies.admit(on_rule("CREATE", mine, None)).allowed
    assert policies.admit(on_rule("DELETE", None, mine)).allowed


@pytest.mark.parametrize(("operation", "new", "old"), [
    ("CREATE", taint_rule("node-b"), None),  # NoExecute on another node's device
    ("CREATE", taint_rule("node-a", device=None), None),  # the whole pool
    ("CREATE", taint_rule("node-a", driver="nvidia.com"), None),  # another driver's devices
    ("DELETE", None, taint_rule("node-b")),  # lifting another node's taint
    ("UPDATE", taint_rule("node-b"), taint_rule("node-a")),
], ids=["other-node", "whole-pool", "other-driver", "delete-other", "move-to-other"])  # fmt: skip
def test_the_solver_taints_no_other_nodes_devices(policies: Policies, operation: str, new: dict[str, object] | None,
                                                 old: dict[str, object] | None) -> None:
    assert denied(policies.admit(on_rule(operation, new, old)), "gpushare-solver-own-devices")


def test_others_are_not_the_policies_business(policies: Policies) -> None:
    """The scheduler, the kubelet, an administrator: RBAC decides for them, not these policies."""
    admin = Request("CREATE", "", "slice", "kubernetes-admin", resource_slice("node-b"), None,
                    group="resource.k8s.io", resource="resourceslices", kind="ResourceSlice")
    assert policies.admit(admin).allowed
