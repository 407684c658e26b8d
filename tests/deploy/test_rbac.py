"""k8s/base/rbac.yaml grants each service exactly the Kubernetes API calls its code makes.

The common adapter (``gpushare_common.adapters.kube.Kube``) is run once per public method
against a recording transport: every HTTP request it makes (method, path, ``watch``) becomes
the RBAC (apiGroup, resource, verb) it needs. Each service package is read (AST) for calls
of those methods. The result, per ServiceAccount ``gpushare-<service>``, must equal what its
(Cluster)RoleBindings grant: nothing missing, nothing unused. Calls a service makes in the system
namespace only (its Lease, its ShadowPods) must be granted there by a RoleBinding, not cluster-wide.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
from collections.abc import AsyncIterator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpushare_common.adapters.kube import Kube
from gpushare_common.settings import KubeSettings
from kubernetes.client import Configuration

ROOT = Path(__file__).resolve().parents[2]
RBAC = ROOT / "k8s" / "base" / "rbac.yaml"
SERVICES = ("detector", "solver", "deviceplugin", "kmod-bridge", "shadow-controller", "nats-auth")
SYSTEM_NAMESPACE = "gpushare-system"
# (group, resource, verb) a service uses in the system namespace only: its settings name that
# namespace (GPUSHARE_SHADOW_LEASE_NAMESPACE; ShadowPods live in the system namespace)
IN_SYSTEM_NAMESPACE = {
    "shadow-controller": {("coordination.k8s.io", "leases", "get"), ("coordination.k8s.io", "leases", "create"),
                          ("coordination.k8s.io", "leases", "update"), ("", "pods", "create"), ("", "pods", "delete")},
}
API_PATH = re.compile(r"/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)(?:/namespaces/[^/]+)?/(?P<resource>[a-z]+)"
                      r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[a-z]+))?)?")  # fmt: skip
# Dynamic Resource Allocation calls are made on DRA nodes only; the chart grants them with its dra
# switch (tests/dra/test_chart_dra.py compares those), never in k8s/base
DRA_GROUP = "resource.k8s.io"
ITEM_VERBS = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
COLLECTION_VERBS = {"GET": "list", "POST": "create", "DELETE": "deletecollection"}


@dataclass(frozen=True, order=True)
class Grant:
    group: str
    resource: str
    verb: str
    namespace: str = ""  # "" = cluster-wide

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        return f"{self.group or 'core'}/{self.resource}:{self.verb}{where}"

    def scoped(self, service: str) -> Grant:
        """Where ``service`` needs this grant: the system namespace or the whole cluster."""
        if (self.group, self.resource, self.verb) in IN_SYSTEM_NAMESPACE.get(service, set()):
            return Grant(self.group, self.resource, self.verb, SYSTEM_NAMESPACE)
        return self


class UnknownApiCall(ValueError):
    pass


def api_operation(method: str, path: str, watch: bool = False) -> Grant:
    """``GET /api/v1/namespaces/n/pods`` -> ("", "pods", "list"); with ``watch``, "watch"."""
    match = API_PATH.fullmatch(path)
    verbs = ITEM_VERBS if match and match.group("name") else COLLECTION_VERBS
    if match is None or method not in verbs:
        raise UnknownApiCall(f"{method} {path}: not a Kubernetes resource request")
    resource = match.group("resource") + (f"/{match.group('sub')}" if match.group("sub") else "")
    verb = "watch" if watch and verbs[method] == "list" else verbs[method]
    return Grant(match.group("group") or "", resource, verb)


# --- the adapter: method -> grants, recorded ---------------------------------------------


class RecordingKube(Kube):
    """The adapter with its HTTP exchanges replaced: requests are recorded, answers are empty."""

    def __init__(self, stop: asyncio.Event) -> None:
        super().__init__(KubeSettings(), Configuration(host="http://recorder.invalid"))
        self.stop = stop
        self.requests: list[tuple[str, str, bool]] = []

    async def _send(self, what: str, method: str, path: str, query: list[tuple[str, str]], body: Any,
                    content_type: str) -> bytes:
        self.requests.append((method, path, False))
        return b'{"items": [], "metadata": {"resourceVersion": "1"}}'

    async def _events(self, stop: asyncio.Event, reader: ThreadPoolExecutor, what: str, path: str, version: str,
                      field_selector: str, label_selector: str) -> AsyncIterator[tuple[str, Any]]:
        self.requests.append(("GET", path, True))
        self.stop.set()  # one watch request is enough
        return
        yield "", {}


def _argument(parameter: inspect.Parameter, stop: asyncio.Event) -> Any:
    kind = str(parameter.annotation)
    return stop if "Event" in kind else {} if "Obj" in kind or "dict" in kind else "x"


async def _record(name: str) -> set[Grant]:
    stop = asyncio.Event()
    kube = RecordingKube(stop)
    method = getattr(kube, name)
    args = [_argument(p, stop) for p in inspect.signature(method).parameters.values() if p.default is p.empty]
    result = method(*args)
    if inspect.isasyncgen(result):
        async with asyncio.timeout(10):
            async for _ in result:
                pass
    else:
        await result
    await kube.close()
    return {api_operation(*request) for request in kube.requests}


def adapter_operations() -> dict[str, set[Grant]]:
    """Public coroutine method of ``Kube`` -> every API operation it performs."""
    names = [n for n, f in inspect.getmembers(Kube) if not n.startswith("_") and n != "close"
             and (inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f))]  # fmt: skip
    return {name: asyncio.run(_record(name)) for name in names}


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


def needed_grants(service_dir: Path, operations: dict[str, set[Grant]], service: str = "",
                  dra: bool = False) -> set[Grant]:
    """The grants a service's calls need (with ``dra``, only its DRA ones; else the others)."""
    calls = called_methods(sorted(service_dir.rglob("*.py")), operations)
    return {grant.scoped(service) for method in calls for grant in operations[method]
            if (grant.group == DRA_GROUP) == dra}


# --- rbac.yaml: what each ServiceAccount is granted ----------------------------------


def _rules(rules: list[dict[str, Any]], namespace: str = "") -> Iterator[Grant]:
    for rule in rules:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    yield Grant(group, resource, verb, namespace)


def granted(docs: list[dict[str, Any]]) -> dict[str, set[Grant]]:
    """ServiceAccount name -> every (group, resource, verb, namespace) its bindings grant; a
    RoleBinding grants in its own namespace only, a ClusterRoleBinding cluster-wide ("")."""
    roles = {(d["kind"], d["metadata"]["name"]): d.get("rules") or []
             for d in docs if d["kind"] in ("Role", "ClusterRole")}  # fmt: skip
    result: dict[str, set[Grant]] = {d["metadata"]["name"]: set() for d in docs if d["kind"] == "ServiceAccount"}
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        ref = binding["roleRef"]
        namespace = binding["metadata"]["namespace"] if binding["kind"] == "RoleBinding" else ""
        for subject in binding["subjects"]:
            if subject["kind"] == "ServiceAccount":
                result.setdefault(subject["name"], set()).update(_rules(roles[(ref["kind"], ref["name"])], namespace))
    return result


def compare(granted_to: set[Grant], needed: set[Grant]) -> tuple[list[str], list[str]]:
    """(missing, unused) as readable lists."""
    return sorted(map(str, needed - granted_to)), sorted(map(str, granted_to - needed))


def rbac_docs(text: str | None = None) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(RBAC.read_text() if text is None else text) if d]


@pytest.fixture(scope="module")
def operations() -> dict[str, set[Grant]]:
    return adapter_operations()


# --- tests ------------------------------------------------------------------------------


def test_adapter_operations_are_the_api_calls_of_each_method(operations: dict[str, set[Grant]]) -> None:
    pods = "pods"
    assert operations["watch_pods"] == {Grant("", pods, "list"), Grant("", pods, "watch")}
    assert operations["patch_pod_status"] == {Grant("", "pods/status", "patch")}
    assert operations["replace_lease"] == {Grant("coordination.k8s.io", "leases", "update")}
    assert operations["get_node"] == {Grant("", "nodes", "get")}
    assert all(operations.values()), "every public method performs at least one API call"


@pytest.mark.parametrize(("method", "path", "watch", "expected"), [
    ("GET", "/api/v1/pods", False, Grant("", "pods", "list")),
    ("GET", "/api/v1/namespaces/a/pods", True, Grant("", "pods", "watch")),
    ("PATCH", "/api/v1/namespaces/a/pods/p/status", False, Grant("", "pods/status", "patch")),
    ("POST", "/api/v1/namespaces/a/events", False, Grant("", "events", "create")),
    ("PUT", "/apis/coordination.k8s.io/v1/namespaces/a/leases/l", False,
     Grant("coordination.k8s.io", "leases", "update")),
    ("GET", "/api/v1/nodes/n", False, Grant("", "nodes", "get")),
])  # fmt: skip
def test_api_operation_of_a_request(method: str, path: str, watch: bool, expected: Grant) -> None:
    assert api_operation(method, path, watch) == expected


@pytest.mark.parametrize(("method", "path"), [("POST", "/api/v1/namespaces/a/pods/p"), ("GET", "/version"),
                                              ("CONNECT", "/api/v1/namespaces/a/pods")])
def test_unknown_request_is_a_clear_error(method: str, path: str) -> None:
    with pytest.raises(UnknownApiCall, match=re.escape(path)):
        api_operation(method, path)


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
    needed = needed_grants(package_dir(service), operations, service)
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


def test_shadow_pods_are_created_and_deleted_in_the_system_namespace_only() -> None:
    grants = granted(rbac_docs())["gpushare-shadow-controller"]
    writes = {g for g in grants if g.resource == "pods" and g.verb not in ("list", "watch")}
    assert writes == {Grant("", "pods", "create", SYSTEM_NAMESPACE), Grant("", "pods", "delete", SYSTEM_NAMESPACE)}


def test_a_cluster_wide_grant_of_a_namespaced_call_is_reported(operations: dict[str, set[Grant]]) -> None:
    docs = rbac_docs()
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpushare-shadow-controller"]
    role["rules"][0]["verbs"].append("create")
    needed = needed_grants(package_dir("shadow-controller"), operations, "shadow-controller")
    assert compare(granted(docs)["gpushare-shadow-controller"], needed) == ([], ["core/pods:create"])
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding" and "shadowpods" in d["metadata"]["name"]]
    binding["metadata"]["namespace"] = "team-a"
    assert compare(granted(docs)["gpushare-shadow-controller"], needed) == (
        ["core/pods:create in gpushare-system", "core/pods:delete in gpushare-system"],
        ["core/pods:create", "core/pods:create in team-a", "core/pods:delete in team-a"])


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
    (tmp_path / "m.py").write_text("async def f(kube):\n    await kube.get_node('n')\n")
    assert needed_grants(tmp_path, operations) == {Grant("", "nodes", "get")}
