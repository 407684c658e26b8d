"""Server-side tables: the columns and cells kubectl shows, content negotiation, and
`includeObject`; the durations written the way kubectl writes them."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from gpushare_sim.apiserver import tables
from gpushare_sim.apiserver.printers import claim_state, human_duration
from gpushare_sim.apiserver.printers_core import CORE
from hypothesis import given
from hypothesis import strategies as st

from tests.support.kubeapi import KubeApi, pod_manifest

TABLE = ("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,"
         "application/json")  # what kubectl get sends


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(-5, "<invalid>"), (-1, "0s"), (0, "0s"), (59, "59s"), (119, "119s"), (120, "2m"), (121, "2m1s"),
     (599, "9m59s"), (600, "10m"), (3 * 3600 - 1, "179m"), (3 * 3600, "3h"), (3 * 3600 + 60, "3h1m"),
     (8 * 3600, "8h"), (47 * 3600, "47h"), (48 * 3600, "2d"), (49 * 3600, "2d1h"), (8 * 86400, "8d"),
     (729 * 86400, "729d"), (730 * 86400, "2y"), (731 * 86400, "2y1d"), (8 * 365 * 86400, "8y")],
)  # fmt: skip
def test_human_duration(seconds: int, shown: str) -> None:
    assert human_duration(seconds) == shown


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12))
def test_human_duration_is_always_written(seconds: float) -> None:
    assert human_duration(seconds)


def container(state: dict[str, Any], ready: bool = False, restarts: int = 0, **extra: Any) -> dict[str, Any]:
    return {"name": "main", "state": state, "ready": ready, "restartCount": restarts, **extra}


@pytest.mark.parametrize(
    ("status", "deleting", "ready", "shown"),
    [
        ({"phase": "Pending"}, False, "0/1", "Pending"),
        ({"phase": "Pending", "containerStatuses": [container({"waiting": {"reason": "ContainerCreating"}})]},
         False, "0/1", "ContainerCreating"),
        ({"phase": "Running", "containerStatuses": [container({"running": {}}, ready=True)]}, False, "1/1", "Running"),
        ({"phase": "Running", "containerStatuses": [container({"running": {}}, ready=True)]}, True, "1/1",
         "Terminating"),
        ({"phase": "Running", "containerStatuses": [container({"terminated": {"exitCode": 137}})]}, False, "0/1",
         "ExitCode:137"),
        ({"phase": "Failed", "reason": "UnexpectedAdmissionError"}, False, "0/1", "UnexpectedAdmissionError"),
        ({"phase": "Succeeded", "containerStatuses": [container({"terminated": {"exitCode": 0,
                                                                               "reason": "Completed"}})]},
         True, "0/1", "Completed"),
    ],
)  # fmt: skip
def test_pod_status_cell(status: dict[str, Any], deleting: bool, ready: str, shown: str) -> None:
    pod: dict[str, Any] = {**pod_manifest("p"), "status": status}
    if deleting:
        pod["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    cells = CORE["pods"].cells(pod, 0.0)
    assert (cells[1], cells[2]) == (ready, shown)


def test_restarts_show_when_last() -> None:
    last = {"terminated": {"finishedAt": "2026-01-01T00:00:00Z", "exitCode": 1}}
    pod = {**pod_manifest("p"), "status": {"containerStatuses": [
        container({"running": {}}, ready=True, restarts=3, lastState=last)]}}  # fmt: skip
    now = 1767225600.0 + 150  # 2026-01-01T00:02:30Z
    assert CORE["pods"].cells(pod, now)[3] == "3 (2m30s ago)"


def test_claim_states() -> None:
    assert claim_state({"metadata": {}}) == "pending"
    assert claim_state({"metadata": {}, "status": {"allocation": {"devices": {}}, "reservedFor": [{}]}}) == (
        "allocated,reserved")
    assert claim_state({"metadata": {"deletionTimestamp": "x"}}) == "deleted"


def test_negotiation() -> None:
    assert tables.negotiate("application/json", {}) is None
    assert tables.negotiate(None, {}) is None
    wanted = tables.negotiate(TABLE, {"includeObject": "Object"})
    assert wanted == tables.TableRequest("v1", "Object")
    assert tables.negotiate("application/json;as=Table;v=v1beta1;g=meta.k8s.io", {}) == tables.TableRequest(
        "v1beta1", "Metadata")  # fmt: skip
    assert tables.negotiate("application/json;as=Table;v=v9;g=meta.k8s.io, application/json", {}) is None


def get(kube_api: KubeApi, path: str, accept: str = TABLE) -> tuple[int, str, dict[str, Any]]:
    request = urllib.request.Request(f"{kube_api.url}{path}", headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers["Content-Type"], json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], json.loads(error.read())


def test_tables_over_http(kube_api: KubeApi) -> None:
    kube_api.seed("pods", "default", [pod_manifest("p1", labels={"a": "b"})])
    code, media, body = get(kube_api, "/api/v1/namespaces/default/pods")
    assert code == 200 and media == "application/json;as=Table;v=v1;g=meta.k8s.io"
    assert body["kind"] == "Table" and [c["name"] for c in body["columnDefinitions"]][:3] == ["Name", "Ready", "Status"]
    row = body["rows"][0]
    assert row["cells"][0] == "p1" and row["object"]["kind"] == "PartialObjectMetadata"
    assert row["object"]["metadata"]["labels"] == {"a": "b"}
    _, _, full = get(kube_api, "/api/v1/namespaces/default/pods/p1?includeObject=Object")
    assert full["rows"][0]["object"]["spec"]["containers"][0]["name"] == "main"
    _, _, bare = get(kube_api, "/api/v1/namespaces/default/pods?includeObject=None")
    assert "object" not in bare["rows"][0]
    _, _, leases = get(kube_api, "/apis/coordination.k8s.io/v1/leases")
    assert [c["name"] for c in leases["columnDefinitions"]] == ["Name", "Holder", "Age"]
    _, _, rules = get(kube_api, "/apis/resource.k8s.io/v1alpha3/devicetaintrules")
    assert [c["name"] for c in rules["columnDefinitions"]] == ["Name", "Created At"]
    code, _, status = get(kube_api, "/api/v1/pods?includeObject=Everything")
    assert code == 400 and "includeObject must be one of" in status["message"]
    assert get(kube_api, "/api/v1/namespaces/default/pods", accept="application/json")[2]["kind"] == "PodList"
