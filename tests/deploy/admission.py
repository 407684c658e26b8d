"""ValidatingAdmissionPolicies evaluated the way the API server does, with a real CEL evaluator.

Requests for pods by default; for any other resource (ResourceSlices, DeviceTaintRules) with
its group, version, resource and kind.

The policies, their bindings and their parameters are read from rendered manifests (the shipped
YAML); each CEL expression runs in ``cel-python`` against an admission request (``request``,
``object``, ``oldObject``, ``params``, ``variables``). What the API server does around the
expressions is done here in a few lines: match constraints (resource rules, namespace selector),
bindings with their parameters (``parameterNotFoundAction``), match conditions, variables, and
``failurePolicy: Fail`` (an expression that errors denies). Any field of a policy or binding this
harness does not implement is an error, never silently ignored.

The CEL the policies rely on (checked by ``functions_used``): ``has``, the macros ``all`` and
``exists``, ``size``, ``in`` on maps and lists, ``startsWith``, ``matches``, indexing, field
selection, list literals, ``==``/``!=`` on strings, lists, maps and objects, ``!``, ``&&``, ``||``.
All of it is standard CEL, evaluated alike by cel-go in the API server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.celparser import CELParser
from celpy.evaluation import CELEvalError
from lark import Token, Tree

SUPPORTED_POLICY_FIELDS = {"failurePolicy", "matchConstraints", "matchConditions", "variables", "validations",
                           "paramKind"}  # fmt: skip
SUPPORTED_BINDING_FIELDS = {"policyName", "validationActions", "paramRef"}
_ENV = celpy.Environment()


class UnsupportedPolicy(ValueError):
    pass


@dataclass(frozen=True)
class Request:
    """An admission request, as the API server builds it: for a pod unless the resource is given
    (``group``, ``version``, ``resource``, ``kind``; ``namespace`` "" for a cluster-scoped one)."""

    operation: str  # CREATE, UPDATE, DELETE
    namespace: str
    name: str
    username: str
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = None
    subresource: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, list[str]] = field(default_factory=dict)
    group: str = ""
    version: str = "v1"
    resource: str = "pods"
    kind: str = "Pod"

    def document(self) -> dict[str, Any]:
        user: dict[str, Any] = {"username": self.username}
        if self.groups:  # omitted when empty, as the API server's JSON does
            user["groups"] = list(self.groups)
        if self.extra:
            user["extra"] = self.extra
        resource = {"group": self.group, "version": self.version, "resource": self.resource}
        return {"operation": self.operation, "namespace": self.namespace, "name": self.name,
                "kind": {"group": self.group, "version": self.version, "kind": self.kind}, "resource": resource,
                "subResource": self.subresource, "userInfo": user, "dryRun": False}  # fmt: skip


@dataclass(frozen=True)
class Decision:
    allowed: bool
    policy: str = ""
    message: str = ""


def _cel(value: Any) -> Any:
    return json_to_cel(value)


def evaluate(expression: str, activation: dict[str, Any]) -> Any:
    """One CEL expression; raises ``CELEvalError`` when it errors."""
    return _ENV.program(_ENV.compile(expression)).evaluate(activation)


def _check_fields(doc: dict[str, Any], supported: set[str]) -> None:
    unknown = set(doc["spec"]) - supported
    if unknown:
        raise UnsupportedPolicy(f"{doc['kind']} {doc['metadata']['name']}: {sorted(unknown)} not evaluated here")


def _selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for term in selector.get("matchExpressions", []):
        present = term["key"] in labels
        match term["operator"]:
            case "In":
                ok = present and labels[term["key"]] in term["values"]
            case "NotIn":
                ok = not present or labels[term["key"]] not in term["values"]
            case "Exists":
                ok = present
            case "DoesNotExist":
                ok = not present
            case other:
                raise UnsupportedPolicy(f"namespaceSelector operator {other}")
        if not ok:
            return False
    return True


def _resource_matches(constraints: dict[str, Any], request: Request) -> bool:
    if set(constraints) - {"resourceRules", "namespaceSelector"}:
        raise UnsupportedPolicy(f"matchConstraints {sorted(constraints)}")
    resource = request.resource + (f"/{request.subresource}" if request.subresource else "")
    rules = constraints["resourceRules"]
    if not any(request.group in r["apiGroups"] and request.operation in r["operations"] and resource in r["resources"]
               and {"*", request.version} & set(r.get("apiVersions", ["*"])) for r in rules):  # fmt: skip
        return False
    if not request.namespace:  # a cluster-scoped object: the namespace selector does not apply
        return True
    namespace_labels = {"kubernetes.io/metadata.name": request.namespace}
    return _selector_matches(constraints.get("namespaceSelector", {}), namespace_labels)


class Policies:
    """The policies, bindings and parameter objects among ``docs`` (rendered manifests)."""

    def __init__(self, docs: list[dict[str, Any]]) -> None:
        self.policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
        self.bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
        self.objects = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in docs}
        for doc in self.policies.values():
            _check_fields(doc, SUPPORTED_POLICY_FIELDS)
        for doc in self.bindings:
            _check_fields(doc, SUPPORTED_BINDING_FIELDS)

    def admit(self, request: Request) -> Decision:
        """Allowed unless a bound policy that matches the request denies it."""
        for binding in self.bindings:
            policy = self.policies[binding["spec"]["policyName"]]
            if not _resource_matches(policy["spec"]["matchConstraints"], request):
                continue
            denial = self._evaluate(policy, binding, request)
            if denial is not None and "Deny" in binding["spec"]["validationActions"]:
                return Decision(False, policy["metadata"]["name"], denial)
        return Decision(True)

    def _params(self, binding: dict[str, Any]) -> tuple[Any, str | None]:
        ref = binding["spec"].get("paramRef")
        if ref is None:
            return None, None
        policy = self.policies[binding["spec"]["policyName"]]
        kind = policy["spec"]["paramKind"]["kind"]
        found = self.objects.get((kind, ref["namespace"], ref["name"]))
        if found is None and ref["parameterNotFoundAction"] == "Deny":
            return None, f"no {kind} {ref['namespace']}/{ref['name']} (the policy's parameter)"
        return found, None

    def _evaluate(self, policy: dict[str, Any], binding: dict[str, Any], request: Request) -> str | None:
        """None when the policy allows the request, else why it is denied."""
        params, missing = self._params(binding)
        if missing:
            return missing
        spec = policy["spec"]
        activation: dict[str, Any] = {
            "request": _cel(request.document()), "object": _cel(request.object),
            "oldObject": _cel(request.old_object), "params": _cel(params)}  # fmt: skip
        fail_open = spec.get("failurePolicy", "Fail") == "Ignore"
        for condition in spec.get("matchConditions", []):
            try:
                if not evaluate(condition["expression"], activation):
                    return None
            except CELEvalError as err:
                return None if fail_open else f"match condition {condition['name']}: {err}"
        variables: dict[Any, Any] = {}
        for variable in spec.get("variables", []):  # each sees the ones before it
            activation["variables"] = celtypes.MapType(variables)
            try:
                variables[celtypes.StringType(variable["name"])] = evaluate(variable["expression"], activation)
            except CELEvalError as err:  # an error only when the variable is used, as in the API server
                variables[celtypes.StringType(variable["name"])] = err
        activation["variables"] = celtypes.MapType(variables)
        for validation in spec["validations"]:
            try:
                if not evaluate(validation["expression"], activation):
                    return str(validation["message"])
            except CELEvalError as err:
                if not fail_open:
                    return f"{validation['message']} (expression error: {err})"
        return None


def expressions(docs: list[dict[str, Any]]) -> list[str]:
    """Every CEL expression of the policies among ``docs``."""
    found = []
    for doc in docs:
        if doc["kind"] == "ValidatingAdmissionPolicy":
            spec = doc["spec"]
            for part in ("matchConditions", "variables", "validations"):
                found += [item["expression"] for item in spec.get(part, [])]
    return found


def functions_used(expression: str) -> set[str]:
    """The functions, macros and methods an expression calls (from the CEL parse tree)."""
    names = set()
    for node in CELParser().parse(expression).iter_subtrees():
        if node.data == "ident_arg":
            names.add(str(node.children[0]))
        elif node.data == "member_dot_arg":
            names.add(str(node.children[1]))
    return names


def operators_used(expression: str) -> set[str]:
    """The grammar rules (operators, literals, selections) an expression uses."""
    tree = CELParser().parse(expression)
    return {n.data for n in tree.iter_subtrees() if isinstance(n, Tree) and not isinstance(n, Token)}
