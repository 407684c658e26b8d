"""k8s/base/rbac.yaml grants each service exactly the Kubernetes API calls its code makes.

The calls are collected statically. The common adapter (``gpushare_common.adapters.kube``)
is read to learn which API operations each of its methods performs (following calls
between its own methods, and ``watch`` where a list call is made with ``"watch": True``);
each service package is read for calls of those methods. The result, per ServiceAccount
``gpushare-<service>``, must equal what its (Cluster)RoleBindings grant: nothing missing,
nothing unused.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = ROOT / "libs" / "common" / "gpushare_common" / "adapters" / "kube.py"
RBAC = ROOT / "k8s" / "base" / "rbac.yaml"
SERVICES = ("detector", "solver", "deviceplugin", "kmod-bridge", "shadow-controller")
API_GROUPS = {"core": "", "coordination": "coordination.k8s.io"}
VERBS = {"read": "get", "list": "list", "create": "create", "delete": "delete", "patch": "patch",
         "replace": "update"}  # fmt: skip


@dataclass(frozen=True, order=True)
class Grant:
    group: str
    resource: str
    verb: str

    def __str__(self) -> str:
        return f"{self.group or 'core'}/{self.resource}:{self.verb}"


class UnknownApiCall(ValueError):
    pass


def api_operation(client_method: str, api: str, watch: bool = False) -> Grant:
    """``list_namespaced_pod`` on ``core`` -> ("", "pods", "list"); ``watch`` turns list into watch."""
    match = re.fullmatch(r"(read|list|create|delete|patch|replace)_(namespaced_)?(\w+?)(_for_all_namespaces)?",
                         client_method)  # fmt: skip
    if match is None or api not in API_GROUPS:
        raise UnknownApiCall(f"{api}.{client_method}: not a known Kubernetes client operation")
    kind, *subresource = match.group(3).split("_", 1)
    resource = kind + "s" + "".join(f"/{s}" for s in subresource)
    verb = "watch" if watch and match.group(1) == "list" else VERBS[match.group(1)]
    return Grant(API_GROUPS[api], resource, verb)


# --- the adapter: method -> grants -----------------------------------------------------


def _sets_watch(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Dict):
            for key, value in zip(sub.keys, sub.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "watch" and \
                        isinstance(value, ast.Constant) and value.value is True:  # fmt: skip
                    return True
    return False


def _direct(method: ast.AsyncFunctionDef | ast.FunctionDef) -> tuple[set[Grant], set[str]]:
    """Client operations referenced in ``method`` and the ``self`` methods it calls."""
    grants: set[Grant] = set()
    calls: set[str] = set()
    watch = _sets_watch(method)
    for node in ast.walk(method):
        if not isinstance(node, ast.Attribute) or not isinstance(node.value, ast.Attribute):
            continue
        owner = node.value
        if isinstance(owner.value, ast.Name) and owner.value.id == "self" and owner.attr in API_GROUPS:
            grants.add(api_operation(node.attr, owner.attr, watch))
    for node in ast.walk(method):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) and node.func.value.id == "self":  # fmt: skip
            calls.add(node.func.attr)
    return grants, calls


def adapter_operations(source: str) -> dict[str, set[Grant]]:
    """Public method of class ``Kube`` -> every API operation it performs (transitively)."""
    (cls,) = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Kube"]
    direct = {m.name: _direct(m) for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def closure(name: str, seen: frozenset[str]) -> set[Grant]:
        grants, calls = direct[name]
        result = set(grants)
        for callee in calls & direct.keys() - seen:
            result |= closure(callee, seen | {callee})
        return result

    return {name: closure(name, frozenset({name})) for name in direct if not name.startswith("_")}


# --- the services: which adapter methods they call -----------------------------------


def package_dir(service: str) -> Path:
    return ROOT / "services" / service / f"gpushare_{service.replace('-', '_')}"


def called_methods(paths: Iterable[Path], names: Iterable[str]) -> dict[str, set[str]]:
    """Adapter method name -> the files that call it."""
    wanted = set(names)
    found: dict[str, set[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in wanted:
                found.setdefault(node.func.attr, set()).add(str(path))
    return found


def needed_grants(service_dir: Path, operations: dict[str, set[Grant]]) -> set[Grant]:
    calls = called_methods(sorted(service_dir.rglob("*.py")), operations)
    return {grant for method in calls for grant in operations[method]}


# --- rbac.yaml: what each ServiceAccount is granted ----------------------------------


def _rules(rules: list[dict[str, Any]]) -> Iterator[Grant]:
    for rule in rules:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    yield Grant(group, resource, verb)


def granted(docs: list[dict[str, Any]]) -> dict[str, set[Grant]]:
    """ServiceAccount name -> every (group, resource, verb) its bindings grant."""
    roles = {(d["kind"], d["metadata"]["name"]): set(_rules(d.get("rules") or []))
             for d in docs if d["kind"] in ("Role", "ClusterRole")}  # fmt: skip
    result: dict[str, set[Grant]] = {d["metadata"]["name"]: set() for d in docs if d["kind"] == "ServiceAccount"}
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        ref = binding["roleRef"]
        for subject in binding["subjects"]:
            if subject["kind"] == "ServiceAccount":
                result.setdefault(subject["name"], set()).update(roles[(ref["kind"], ref["name"])])
    return result


def compare(granted_to: set[Grant], needed: set[Grant]) -> tuple[list[str], list[str]]:
    """(missing, unused) as readable lists."""
    return sorted(map(str, needed - granted_to)), sorted(map(str, granted_to - needed))


def rbac_docs(text: str | None = None) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(RBAC.read_text() if text is None else text) if d]


@pytest.fixture(scope="module")
def operations() -> dict[str, set[Grant]]:
    return adapter_operations(ADAPTER.read_text())


# --- tests ------------------------------------------------------------------------------


def test_adapter_operations_are_the_api_calls_of_each_method(operations: dict[str, set[Grant]]) -> None:
    pods = "pods"
    assert operations["watch_pods"] == {Grant("", pods, "list"), Grant("", pods, "watch")}
    assert operations["patch_pod_status"] == {Grant("", "pods/status", "patch")}
    assert operations["replace_lease"] == {Grant("coordination.k8s.io", "leases", "update")}
    assert operations["get_node"] == {Grant("", "nodes", "get")}
    assert all(operations.values()), "every public method performs at least one API call"


@pytest.mark.parametrize(("method", "api", "watch", "expected"), [
    ("list_pod_for_all_namespaces", "core", False, Grant("", "pods", "list")),
    ("list_namespaced_pod", "core", True, Grant("", "pods", "watch")),
    ("patch_namespaced_pod_status", "core", False, Grant("", "pods/status", "patch")),
    ("create_namespaced_event", "core", False, Grant("", "events", "create")),
    ("read_namespaced_lease", "coordination", False, Grant("coordination.k8s.io", "leases", "get")),
])  # fmt: skip
def test_api_operation_names(method: str, api: str, watch: bool, expected: Grant) -> None:
    assert api_operation(method, api, watch) == expected


@pytest.mark.parametrize(("method", "api"), [("connect_get_namespaced_pod_exec", "core"),
                                             ("list_namespaced_pod", "apps_v2")])
def test_unknown_api_operation_is_a_clear_error(method: str, api: str) -> None:
    with pytest.raises(UnknownApiCall, match=method):
        api_operation(method, api)


def test_services_reach_the_api_only_through_the_adapter() -> None:
    for service in SERVICES:
        for path in package_dir(service).rglob("*.py"):
            tree = ast.parse(path.read_text())
            imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
            assert not {m for m in imported if m.split(".")[0] == "kubernetes"}, path


@pytest.mark.parametrize("service", SERVICES)
def test_rbac_grants_exactly_the_calls_of_the_service(service: str,
                                                      operations: dict[str, set[Grant]]) -> None:
    needed = needed_grants(package_dir(service), operations)
    missing, unused = compare(granted(rbac_docs()).get(f"gpushare-{service}", set()), needed)
    assert (missing, unused) == ([], []), f"gpushare-{service}: missing {missing}, unused {unused}"


def test_service_accounts_without_api_calls_mount_no_token(operations: dict[str, set[Grant]]) -> None:
    accounts = {d["metadata"]["name"]: d for d in rbac_docs() if d["kind"] == "ServiceAccount"}
    for service in SERVICES:
        if not needed_grants(package_dir(service), operations):
            assert accounts[f"gpushare-{service}"].get("automountServiceAccountToken") is False, service


def test_each_workload_runs_as_its_own_service_account() -> None:
    for service in SERVICES:
        (workload,) = [d for d in yaml.safe_load_all((ROOT / "k8s" / "base" / f"{service}.yaml").read_text())
                       if d and d["kind"] in ("DaemonSet", "Deployment")]  # fmt: skip
        assert workload["spec"]["template"]["spec"]["serviceAccountName"] == f"gpushare-{service}"


def test_lease_calls_are_granted_in_the_namespace_only() -> None:
    for doc in rbac_docs():
        if doc["kind"] == "ClusterRole":
            assert all(g.resource != "leases" for g in _rules(doc["rules"])), doc["metadata"]["name"]


def test_a_missing_verb_is_reported(operations: dict[str, set[Grant]]) -> None:
    text = RBAC.read_text().replace('verbs: ["get", "list", "patch", "delete"]', 'verbs: ["get", "list", "delete"]')
    assert text != RBAC.read_text()
    needed = needed_grants(package_dir("solver"), operations)
    missing, unused = compare(granted(rbac_docs(text))["gpushare-solver"], needed)
    assert (missing, unused) == (["core/pods:patch"], [])


def test_an_unused_rule_is_reported(operations: dict[str, set[Grant]]) -> None:
    docs = rbac_docs()
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpushare-detector"]
    role["rules"].append({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "*"]})
    needed = needed_grants(package_dir("detector"), operations)
    assert compare(granted(docs)["gpushare-detector"], needed) == ([], ["core/nodes:*", "core/nodes:get"])


def test_a_call_in_a_service_is_found(tmp_path: Path, operations: dict[str, set[Grant]]) -> None:
    (tmp_path / "m.py").write_text("async def f(kube):\n    await kube.api.get_node('n')\n")
    assert needed_grants(tmp_path, operations) == {Grant("", "nodes", "get")}
