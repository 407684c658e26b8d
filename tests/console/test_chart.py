"""The chart's console (k8s/chart/gpushare, ``console.enabled``) matches the console: every
variable it sets is one of the console's settings, its probes are routes the console serves,
and its RBAC grants exactly the reads the console makes (list and watch pods and nodes; with DRA,
ResourceClaims and ResourceSlices)."""

from __future__ import annotations

from typing import Any

import pytest
from gpushare_common.settings import variables
from gpushare_console.settings import ConsoleSettings, Settings

from tests.deploy.chart import render


@pytest.fixture(scope="module")
def console() -> dict[str, Any]:
    docs = render({"console": {"enabled": True, "keep": 200}})
    return {d["kind"]: d for d in docs if d["metadata"]["name"] == "gpushare-console"}


def test_every_variable_the_chart_sets_is_a_console_setting(console: dict[str, Any]) -> None:
    (container,) = console["Deployment"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    known = {v.name for v in variables(Settings)}
    assert set(env) <= known, f"not settings of the console: {sorted(set(env) - known)}"
    assert env["GPUSHARE_CONSOLE_KEEP"] == "200" and env["GPUSHARE_HTTP_PORT"] == "8080"
    assert env["GPUSHARE_KUBE_SYSTEM_NAMESPACE"] == "gpushare-system"
    assert env["GPUSHARE_CONSOLE_VENDOR_RESOURCES"] == "nvidia.com/gpu"
    ConsoleSettings(keep=int(env["GPUSHARE_CONSOLE_KEEP"]))  # in range


def test_probes_are_routes_the_console_serves(console: dict[str, Any]) -> None:
    (container,) = console["Deployment"]["spec"]["template"]["spec"]["containers"]
    paths = {container[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")}
    assert paths <= {"/healthz", "/readyz"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_rbac_grants_only_the_reads_the_console_makes(console: dict[str, Any]) -> None:
    (rule,) = console["ClusterRole"]["rules"]
    assert sorted(rule["resources"]) == ["nodes", "pods"] and sorted(rule["verbs"]) == ["get", "list", "watch"]


def test_it_stays_in_the_cluster_and_asks_who_looks_only_when_told() -> None:
    """ClusterIP by default (reached with kubectl port-forward); with auth=token the console may
    ask the API who is behind a bearer token (TokenReview), and is told whom to let look."""
    assert {d["kind"]: d for d in render({"console": {"enabled": True}})
            if d["metadata"]["name"] == "gpushare-console"}["Service"]["spec"]["type"] == "ClusterIP"
    docs = {d["kind"]: d for d in render({"console": {"enabled": True, "auth": "token",
                                                      "viewers": ["alice", "group:gpu-admins"]}})
            if d["metadata"]["name"] == "gpushare-console"}
    (container,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    settings = ConsoleSettings(auth=env["GPUSHARE_CONSOLE_AUTH"],
                               viewers=tuple(env["GPUSHARE_CONSOLE_VIEWERS"].split(",")))
    assert settings.viewers == ("alice", "group:gpu-admins")
    review = {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}
    assert review in docs["ClusterRole"]["rules"]


def test_with_dra_the_console_reads_claims_and_slices() -> None:
    """``dra.enabled``: the console follows ResourceClaims and ResourceSlices, and may (only read)."""
    docs = {d["kind"]: d for d in render({"console": {"enabled": True}, "dra": {"enabled": True}})
            if d["metadata"]["name"] == "gpushare-console"}
    (container,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUSHARE_CONSOLE_DRA"] == "true"
    claims = {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceslices"],
              "verbs": ["get", "list", "watch"]}
    assert claims in docs["ClusterRole"]["rules"]
