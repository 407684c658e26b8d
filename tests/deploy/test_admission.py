"""The admission policies of k8s/ (as shipped in k8s/base), evaluated with cel-python against
admission requests (tests/deploy/admission_requests.py): who may create, patch and delete which pods.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gpushare_shadow_controller.template import MPS_SCRIPT
from gpushare_solver import disruption
from gpushare_solver.spot import OWNER_BACK

from tests.deploy.admission import Decision, Policies, Request, expressions, functions_used
from tests.deploy.admission_requests import (
    NODE_NAME,
    NS,
    SHADOW_CONTROLLER,
    SOLVER,
    TENANT,
    USING,
    admitted,
    create,
    delete,
    shipped_docs,
    solver_token,
    template_pod,
    tenant_pod,
    update,
)
from tests.deploy.chart import BASE, CHART, render

CAPS = "gpushare.k8s.io/CapsEnforced"

# the CEL the policies may use: what cel-python and the API server's cel-go both evaluate the same
CEL_SUBSET = {"has", "all", "exists", "size", "startsWith", "matches"}


@pytest.fixture(scope="module")
def policies() -> Policies:
    return Policies(shipped_docs())


def denied_by(decision: Decision, policy: str) -> bool:
    return not decision.allowed and decision.policy == policy


# --- the solver: its own node's pods, gpushare annotations and the Using condition only ------------


def set_annotation(key: str, value: str) -> Callable[[dict[str, Any]], None]:
    return lambda pod: pod["metadata"].setdefault("annotations", {}).__setitem__(key, value)


def set_using(users: str) -> Callable[[dict[str, Any]], None]:
    def change(pod: dict[str, Any]) -> None:
        conditions = [c for c in pod["status"].get("conditions", []) if c["type"] != USING]
        pod["status"]["conditions"] = [*conditions, {"type": USING, "status": "True", "reason": "Shared",
                                                     "message": users, "lastTransitionTime": "2026-01-01T00:01:00Z"}]
    return change


def test_solver_deletes_a_pod_on_its_node(policies: Policies) -> None:
    assert policies.admit(delete(admitted(tenant_pod()), SOLVER, solver_token("node-a"))).allowed


def test_solver_may_not_delete_a_pod_on_another_node(policies: Policies) -> None:
    decision = policies.admit(delete(admitted(tenant_pod(), node="node-b"), SOLVER, solver_token("node-a")))
    assert denied_by(decision, "gpushare-solver-own-node")
    assert decision.message == "the solver may delete or patch only pods on its own node"


def test_solver_may_not_delete_a_pending_pod(policies: Policies) -> None:
    decision = policies.admit(delete(admitted(tenant_pod(), node=None), SOLVER, solver_token("node-a")))
    assert denied_by(decision, "gpushare-solver-own-node")


def test_solver_without_a_node_bound_token_is_refused(policies: Policies) -> None:
    decision = policies.admit(delete(admitted(tenant_pod()), SOLVER))
    assert denied_by(decision, "gpushare-solver-own-node") and "names no node" in decision.message
    no_node = {k: v for k, v in solver_token("node-a").items() if k != NODE_NAME}
    assert denied_by(policies.admit(delete(admitted(tenant_pod()), SOLVER, no_node)), "gpushare-solver-own-node")


def test_solver_sets_a_gpushare_annotation(policies: Policies) -> None:
    request = update(admitted(tenant_pod()), set_annotation("gpushare.k8s.io/device-owner", f"{NS}/shadow-1"),
                     SOLVER, extra=solver_token("node-a"))
    assert policies.admit(request).allowed


def test_solver_may_not_annotate_a_pod_on_another_node(policies: Policies) -> None:
    request = update(admitted(tenant_pod(), node="node-b"),
                     set_annotation("gpushare.k8s.io/device-owner", f"{NS}/shadow-1"), SOLVER,
                     extra=solver_token("node-a"))
    assert denied_by(policies.admit(request), "gpushare-solver-own-node")


@pytest.mark.parametrize(("what", "change", "message"), [
    ("another annotation", set_annotation("team.example.com/owner", "mallory"), "only annotations"),
    ("a new foreign annotation", set_annotation("example.com/x", "1"), "only annotations"),
    ("an annotation removed", lambda p: p["metadata"]["annotations"].pop("team.example.com/owner"),
     "only annotations"),
    ("a label", lambda p: p["metadata"].__setitem__("labels", {"app": "x"}), "labels"),
    ("a finalizer", lambda p: p["metadata"].__setitem__("finalizers", ["example.com/keep"]), "labels"),
    ("the spec", lambda p: p["spec"].__setitem__("activeDeadlineSeconds", 1), "spec"),
    ("an image", lambda p: p["spec"]["containers"][0].__setitem__("image", "evil"), "spec"),
])  # fmt: skip
def test_solver_may_change_nothing_else_of_a_pod(policies: Policies, what: str,
                                                 change: Callable[[dict[str, Any]], None], message: str) -> None:
    decision = policies.admit(update(admitted(tenant_pod()), change, SOLVER, extra=solver_token("node-a")))
    assert denied_by(decision, "gpushare-solver-own-node"), what
    assert message in decision.message, (what, decision.message)


def test_solver_sets_the_using_condition_through_the_status_subresource(policies: Policies) -> None:
    shadow = admitted(template_pod())
    first = update(shadow, set_using('{"team-a/inference-1":"gpushare-system/x-0"}'), SOLVER, "status",
                   solver_token("node-a"))
    assert policies.admit(first).allowed
    assert first.object is not None
    again = update(first.object, set_using("{}"), SOLVER, "status", solver_token("node-a"))
    assert policies.admit(again).allowed


@pytest.mark.parametrize(("what", "change"), [
    ("a foreign condition", lambda p: p["status"]["conditions"][0].__setitem__("status", "False")),
    ("a condition added", lambda p: p["status"]["conditions"].append({"type": "example.com/Mine", "status": "True"})),
    ("a condition removed", lambda p: p["status"]["conditions"].pop(0)),
    ("the phase", lambda p: p["status"].__setitem__("phase", "Failed")),
    ("a container status", lambda p: p["status"]["containerStatuses"][0].__setitem__("ready", False)),
    ("the pod IP", lambda p: p["status"].__setitem__("podIP", "10.9.9.9")),
])  # fmt: skip
def test_solver_may_change_no_other_status(policies: Policies, what: str,
                                           change: Callable[[dict[str, Any]], None]) -> None:
    request = update(admitted(template_pod()), change, SOLVER, "status", solver_token("node-a"))
    assert denied_by(policies.admit(request), "gpushare-solver-own-node"), what


def test_solver_status_patch_on_another_node_is_refused(policies: Policies) -> None:
    request = update(admitted(template_pod(), node="node-b"), set_using("{}"), SOLVER, "status", solver_token("node-a"))
    assert denied_by(policies.admit(request), "gpushare-solver-own-node")


def test_other_users_are_not_bound_by_the_solver_policy(policies: Policies) -> None:
    request = update(admitted(tenant_pod(), node="node-b"), set_annotation("team.example.com/owner", "bob"), TENANT)
    assert policies.admit(request).allowed


# --- the solver's evictions told: the DisruptionTarget condition and Events, of its own node --------


def set_disruption(reason: str, status: str = "True") -> Callable[[dict[str, Any]], None]:
    def change(pod: dict[str, Any]) -> None:
        conditions = [c for c in pod["status"].get("conditions", []) if c["type"] != "DisruptionTarget"]
        told = disruption.explain(OWNER_BACK, "dev/alice", ("GPU-0",), "node-a")
        pod["status"]["conditions"] = [*conditions, {**disruption.condition(told), "reason": reason,
                                                     "status": status}]
    return change


@pytest.mark.parametrize("reason", disruption.REASONS)
def test_solver_sets_the_disruption_target_of_a_pod_it_evicts(policies: Policies, reason: str) -> None:
    request = update(admitted(tenant_pod()), set_disruption(reason), SOLVER, "status", solver_token("node-a"))
    assert policies.admit(request).allowed


def test_solver_replaces_a_disruption_target_set_before(policies: Policies) -> None:
    """The taint manager (or the kubelet) may have set one already: the solver's replaces it."""
    pod = admitted(tenant_pod())
    pod["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                        "reason": "DeletionByTaintManager"})
    request = update(pod, set_disruption("OwnerReturned"), SOLVER, "status", solver_token("node-a"))
    assert policies.admit(request).allowed


@pytest.mark.parametrize(("what", "change", "node"), [
    ("a reason not of gpushare", set_disruption("PreemptionByScheduler"), "node-a"),
    ("status False", set_disruption("OwnerReturned", "False"), "node-a"),
    ("a pod on another node", set_disruption("OwnerReturned"), "node-b"),
    ("the condition removed", lambda p: p["status"]["conditions"].pop(), "node-a"),
])  # fmt: skip
def test_solver_sets_no_other_disruption_target(policies: Policies, what: str,
                                                change: Callable[[dict[str, Any]], None], node: str) -> None:
    pod = admitted(tenant_pod(), node=node)
    pod["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True", "reason": "CardGone"})
    request = update(pod, change, SOLVER, "status", solver_token("node-a"))
    assert denied_by(policies.admit(request), "gpushare-solver-own-node"), what


def event_request(body: dict[str, Any], token_node: str = "node-a", user: str = SOLVER) -> Request:
    namespace = body["metadata"]["namespace"]
    return Request("CREATE", namespace, body["metadata"]["name"], user, object=body,
                   extra=solver_token(token_node), resource="events", kind="Event")


@pytest.mark.parametrize(("reason", "warning"), [*((r, False) for r in disruption.REASONS),
                                                 *((r, True) for r in disruption.WARNINGS)])
def test_solver_records_the_events_of_an_eviction(policies: Policies, reason: str, warning: bool) -> None:
    body = disruption.event("team-a/inference-1", "uid-1", reason, "gpushare evicted this pod", "node-a", warning)
    assert policies.admit(event_request(body)).allowed


def _changed(body: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    body = {**body, **{k: dict(v) if isinstance(v, dict) else v for k, v in body.items()}}
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return body


@pytest.mark.parametrize(("what", "path", "value", "message"), [
    ("a Normal refusal", ("type",), "Normal", "only the Events of an eviction"),
    ("a reason not of an eviction", ("reason",), "Killing", "only the Events of an eviction"),
    ("another node", ("reportingInstance",), "node-b", "own node"),
    ("another node as source", ("source", "host"), "node-b", "own node"),
    ("on a node", ("involvedObject", "kind"), "Node", "on pods only"),
    ("as another component", ("reportingComponent",), "kubelet", "on pods only"),
])  # fmt: skip
def test_solver_records_no_other_event(policies: Policies, what: str, path: tuple[str, ...], value: Any,
                                       message: str) -> None:
    body = disruption.event("team-a/inference-1", "uid-1", "EvictionRefused", "refused", "node-a", warning=True)
    decision = policies.admit(event_request(_changed(body, path, value)))
    assert denied_by(decision, "gpushare-solver-events"), what
    assert message in decision.message, (what, decision.message)


def test_other_users_events_are_not_bound_by_the_solver_policy(policies: Policies) -> None:
    body = disruption.event("team-a/inference-1", "", "Killing", "Stopping container main", "node-b")
    assert policies.admit(event_request(body, user=TENANT)).allowed


# --- the shadow-controller: its template, in the system namespace -----------------------------------


def test_shadow_controller_creates_its_template(policies: Policies) -> None:
    assert policies.admit(create(template_pod(), SHADOW_CONTROLLER)).allowed


def with_pod(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    pod = template_pod()
    change(pod)
    return pod


HOST_PATH = {"name": "root", "hostPath": {"path": "/"}}
SIDE_CAR = {"name": "side", "image": "busybox", "command": ["sh"]}


@pytest.mark.parametrize(("what", "pod", "message"), [
    ("in a tenant namespace", template_pod("team-a"), "in the namespace gpushare-system only"),
    ("with a hostPath volume", with_pod(lambda p: p["spec"].__setitem__("volumes", [HOST_PATH])), "no volumes"),
    ("with a second container", with_pod(lambda p: p["spec"]["containers"].append(SIDE_CAR)), "one container"),
    ("with an init container", with_pod(lambda p: p["spec"].__setitem__("initContainers", [SIDE_CAR])),
     "one container"),
    ("with another image", with_pod(lambda p: p["spec"]["containers"][0].__setitem__("image", "busybox")),
     "one container"),
    ("with two cards", with_pod(lambda p: p["spec"]["containers"][0]["resources"].__setitem__(
        "limits", {"nvidia.com/gpu": "2"})), "exactly one card"),
    ("with another resource", with_pod(lambda p: p["spec"]["containers"][0]["resources"]["limits"].__setitem__(
        "memory", "1Gi")), "exactly one card"),
    ("on the host network", with_pod(lambda p: p["spec"].__setitem__("hostNetwork", True)), "host namespaces"),
    ("privileged", with_pod(lambda p: p["spec"]["containers"][0].__setitem__(
        "securityContext", {"privileged": True})), "security context"),
    ("with a command", with_pod(lambda p: p["spec"]["containers"][0].__setitem__("command", ["sh"])),
     "no command"),
    ("with the token mounted", with_pod(lambda p: p["spec"].pop("automountServiceAccountToken")), "mounts"),
    ("as another service account", with_pod(lambda p: p["spec"].__setitem__("serviceAccountName", "admin")),
     "default service account"),
    ("without the ShadowPod label", with_pod(lambda p: p["metadata"]["labels"].pop(
        "gpushare.k8s.io/pod-description")), "labelled"),
    ("with a foreign label", with_pod(lambda p: p["metadata"]["labels"].__setitem__("app", "x")), "labelled"),
    ("with a bad share spec", with_pod(lambda p: p["metadata"]["annotations"].__setitem__(
        "gpushare.k8s.io/share-spec", "0")), "share-spec"),
])  # fmt: skip
def test_shadow_controller_creates_nothing_but_its_template(policies: Policies, what: str, pod: dict[str, Any],
                                                            message: str) -> None:
    decision = policies.admit(create(pod, SHADOW_CONTROLLER))
    assert denied_by(decision, "gpushare-shadowpod-template"), (what, decision)
    assert message in decision.message, (what, decision.message)


def test_shadow_template_without_its_parameters_is_refused() -> None:
    docs = [d for d in shipped_docs() if d["metadata"]["name"] != "gpushare-shadow-template"]
    decision = Policies(docs).admit(create(template_pod(), SHADOW_CONTROLLER))
    assert denied_by(decision, "gpushare-shadowpod-template") and "gpushare-shadow-template" in decision.message


def test_shadow_controller_deletes_only_shadow_pods_in_the_system_namespace(policies: Policies) -> None:
    assert policies.admit(delete(admitted(template_pod()), SHADOW_CONTROLLER)).allowed
    for pod in (tenant_pod(), tenant_pod(namespace=NS)):
        decision = policies.admit(delete(admitted(pod), SHADOW_CONTROLLER))
        assert denied_by(decision, "gpushare-shadowpod-delete"), pod["metadata"]


def set_caps(status: str) -> Callable[[dict[str, Any]], None]:
    def change(pod: dict[str, Any]) -> None:
        conditions = [c for c in pod["status"].get("conditions", []) if c["type"] != CAPS]
        pod["status"]["conditions"] = [*conditions, {"type": CAPS, "status": status, "reason": "MPSDaemonDown",
                                                     "message": "down", "lastTransitionTime": "2026-01-01T00:01:00Z"}]
    return change


def test_shadow_controller_sets_the_caps_condition_of_a_sharepod(policies: Policies) -> None:
    first = update(admitted(tenant_pod()), set_caps("False"), SHADOW_CONTROLLER, "status")
    assert policies.admit(first).allowed
    assert first.object is not None
    assert policies.admit(update(first.object, set_caps("True"), SHADOW_CONTROLLER, "status")).allowed


def gpu_pod() -> dict[str, Any]:
    pod = tenant_pod(name="trainer")
    pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    return pod


@pytest.mark.parametrize(("what", "pod", "change", "message"), [
    ("on a pod that is no SharePod", gpu_pod(), set_caps("False"), "only on SharePods"),
    ("on a ShadowPod", template_pod(), set_caps("False"), "only on SharePods"),
    ("another condition", tenant_pod(), lambda p: p["status"]["conditions"][0].__setitem__("status", "False"),
     "only the pod condition"),
    ("a condition added", tenant_pod(), lambda p: p["status"]["conditions"].append({"type": USING, "status": "True"}),
     "only the pod condition"),
    ("a condition removed", tenant_pod(), lambda p: p["status"]["conditions"].pop(0), "only the pod condition"),
    ("the phase", tenant_pod(), lambda p: p["status"].__setitem__("phase", "Failed"), "status other than"),
    ("a container status", tenant_pod(), lambda p: p["status"]["containerStatuses"][0].__setitem__("ready", False),
     "status other than"),
    ("an annotation", tenant_pod(), set_annotation("gpushare.k8s.io/device-owner", f"{NS}/x"), "annotations"),
    ("a label", tenant_pod(), lambda p: p["metadata"].__setitem__("labels", {"app": "x"}), "labels"),
    ("the spec", tenant_pod(), lambda p: p["spec"].__setitem__("activeDeadlineSeconds", 1), "spec"),
])  # fmt: skip
def test_shadow_controller_may_write_nothing_else_on_a_pod(policies: Policies, what: str, pod: dict[str, Any],
                                                          change: Callable[[dict[str, Any]], None],
                                                          message: str) -> None:
    decision = policies.admit(update(admitted(pod), change, SHADOW_CONTROLLER, "status"))
    assert denied_by(decision, "gpushare-shadow-controller-caps-condition"), (what, decision)
    assert message in decision.message, (what, decision.message)


def test_others_may_still_write_a_sharepods_status(policies: Policies) -> None:
    request = update(admitted(tenant_pod()), lambda p: p["status"].__setitem__("phase", "Succeeded"),
                     "system:node:node-a", "status")
    assert policies.admit(request).allowed


# --- tenants: no ShadowPods of their own, no pods in the system namespace ---------------------------


SHADOW_LABELS = {"gpushare.k8s.io/pod-description": "shadow-pod"}


def test_tenant_may_not_create_a_pod_with_the_shadow_label(policies: Policies) -> None:
    fake = tenant_pod(name="fake-shadow", labels=SHADOW_LABELS,
                      annotations={"gpushare.k8s.io/share-spec": "4", "gpushare.k8s.io/share-kind": "share"})
    decision = policies.admit(create(fake, TENANT))
    assert denied_by(decision, "gpushare-shadowpod-label") and "reserved" in decision.message


def test_no_pod_gains_the_shadow_label_later(policies: Policies) -> None:
    request = update(admitted(tenant_pod()), lambda p: p["metadata"].__setitem__("labels", SHADOW_LABELS), TENANT)
    assert denied_by(policies.admit(request), "gpushare-shadowpod-label")


def test_a_workload_controller_may_not_create_shadow_pods_either(policies: Policies) -> None:
    fake = tenant_pod(name="rs-abc12", labels=SHADOW_LABELS)
    decision = policies.admit(create(fake, "system:serviceaccount:kube-system:replicaset-controller"))
    assert denied_by(decision, "gpushare-shadowpod-label")


def test_shadow_pods_stay_writable_for_the_kubelet(policies: Policies) -> None:
    request = update(admitted(template_pod()), lambda p: p["status"].__setitem__("phase", "Running"),
                     "system:node:node-a", "status")
    assert policies.admit(request).allowed


def test_tenant_creates_ordinary_pods_in_its_namespace(policies: Policies) -> None:
    assert policies.admit(create(tenant_pod(), TENANT)).allowed


def test_tenant_may_not_create_pods_in_the_system_namespace(policies: Policies) -> None:
    decision = policies.admit(create(tenant_pod(namespace=NS), TENANT))
    assert denied_by(decision, "gpushare-system-namespace-pods")
    daemon = "system:serviceaccount:kube-system:daemon-set-controller"
    assert policies.admit(create(tenant_pod(namespace=NS), daemon)).allowed
    admin = Request("CREATE", NS, "debug", "root", object=admitted(tenant_pod(namespace=NS)),
                    groups=("system:masters",))
    assert policies.admit(admin).allowed


# --- the expressions themselves ------------------------------------------------------------------------


def test_policies_use_only_the_cel_both_evaluators_share() -> None:
    found = set().union(*(functions_used(e) for e in expressions(shipped_docs())))
    assert found <= CEL_SUBSET, found - CEL_SUBSET
    assert {"has", "all", "exists", "startsWith"} <= found


def test_every_policy_is_bound_and_denies() -> None:
    docs = shipped_docs()
    policies = {d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    bindings = [d["spec"] for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert policies == {b["policyName"] for b in bindings} and len(policies) == 7
    assert all(b["validationActions"] == ["Deny"] for b in bindings)
    assert all(d["spec"]["failurePolicy"] == "Fail" for d in docs if d["kind"] == "ValidatingAdmissionPolicy")


def test_shipped_policies_are_the_files_in_base() -> None:
    assert (Path(BASE) / "admission-policies.yaml").is_file()


# --- an MPS ShadowPod: admitted only as the chart's shadow.mps values describe it -------------------


@pytest.fixture(scope="module")
def mps_docs() -> list[dict[str, Any]]:
    return render({"shadow": {"mps": {"kinds": ["share-dev"]}}, "vendor": {"cardMemoryMiB": {"nvidia.com/gpu": 81920}}},
                  base=True)


def mps_pod(docs: list[dict[str, Any]], change: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    pod = template_pod(kind="share-dev", docs=docs)  # the real template, with the rendered settings
    assert pod["metadata"]["annotations"]["gpushare.k8s.io/isolation"] == "mps"
    if change is not None:
        change(pod)
    return pod


def test_the_charts_mps_script_is_the_controllers() -> None:
    assert (CHART / "files" / "mps-daemon.sh").read_text() == MPS_SCRIPT


def test_shadow_controller_creates_its_mps_template(mps_docs: list[dict[str, Any]]) -> None:
    pod = mps_pod(mps_docs)
    assert pod["spec"]["containers"][0]["command"][2] == MPS_SCRIPT  # the ConfigMap's, read by the controller
    decision = Policies(mps_docs).admit(create(pod, SHADOW_CONTROLLER))
    assert decision.allowed, decision
    plain = template_pod(docs=mps_docs)  # a share kind not capped stays the pause template
    assert Policies(mps_docs).admit(create(plain, SHADOW_CONTROLLER)).allowed


def _main(pod: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod["spec"]["containers"][0]
    return container


@pytest.mark.parametrize(("what", "change", "message"), [
    ("another script", lambda p: _main(p)["command"].__setitem__(2, "sh -i"), "no command"),
    ("another image", lambda p: _main(p).__setitem__("image", "busybox"), "GPUSHARE_SHADOW_MPS_IMAGE"),
    ("another host directory", lambda p: p["spec"]["volumes"][0]["hostPath"].__setitem__("path", "/"), "no volumes"),
    ("a fourth volume", lambda p: p["spec"]["volumes"].append({"name": "root", "hostPath": {"path": "/"}}),
     "no volumes"),
    ("another environment", lambda p: _main(p)["env"].append({"name": "LD_PRELOAD", "value": "/x.so"}),
     "no command"),
    ("a caps value of another share", lambda p: _main(p)["env"][3].__setitem__("value", "1"), "no command"),
    ("another probe", lambda p: _main(p)["readinessProbe"]["exec"].__setitem__("command", ["sh"]), "no command"),
    ("privileged", lambda p: _main(p).__setitem__("securityContext", {"privileged": True}), "no command"),
])  # fmt: skip
def test_shadow_controller_creates_nothing_but_its_mps_template(mps_docs: list[dict[str, Any]], what: str,
                                                                change: Callable[[dict[str, Any]], None],
                                                                message: str) -> None:
    decision = Policies(mps_docs).admit(create(mps_pod(mps_docs, change), SHADOW_CONTROLLER))
    assert denied_by(decision, "gpushare-shadowpod-template"), (what, decision)
    assert message in decision.message, (what, decision.message)


def test_an_mps_shadowpod_of_a_kind_not_capped_is_refused(mps_docs: list[dict[str, Any]]) -> None:
    pod = mps_pod(mps_docs)
    decision = policies_default().admit(create(pod, SHADOW_CONTROLLER))  # k8s/base: no kind capped
    assert denied_by(decision, "gpushare-shadowpod-template") and "GPUSHARE_SHADOW_MPS_KINDS" in decision.message


def policies_default() -> Policies:
    return Policies(shipped_docs())
