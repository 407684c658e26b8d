"""Bad input gets a Kubernetes Status with the right code, never a 500."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.kubeapi import KubeApi, start_kube_api

POD = {"metadata": {"name": "p1"}, "spec": {"containers": [{"name": "main", "image": "x"}]}}
PODS = "/api/v1/namespaces/default/pods"


class Http:
    """Raw HTTP against the emulator (the official client would fix up bad bodies)."""

    def __init__(self, api: KubeApi) -> None:
        self.url = api.url
        self.pool = urllib3.PoolManager()

    def __call__(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> urllib3.BaseHTTPResponse:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        return self.pool.request(
            method, self.url + path, body=data, headers={"Content-Type": content_type}
        )


@pytest.fixture(scope="module")
def http() -> Iterator[Http]:
    with start_kube_api() as api:
        caller = Http(api)
        assert caller("POST", PODS, POD).status == 201
        yield caller
        caller.pool.clear()


def status(response: urllib3.BaseHTTPResponse, code: int, reason: str | None = None) -> str:
    assert response.status == code, response.data
    body = json.loads(response.data)
    assert body["kind"] == "Status" and body["status"] == "Failure" and body["code"] == code
    if reason is not None:
        assert body["reason"] == reason
    return str(body["message"])


def test_bad_json(http: Http) -> None:
    status(http("POST", PODS, b"{not json"), 400, "BadRequest")
    status(http("POST", PODS, b""), 400)
    status(http("POST", PODS, [1, 2]), 400)
    status(http("PUT", f"{PODS}/p1", b"\xff\xfe"), 400)


@pytest.mark.parametrize("depth", [900, 5000])
def test_deeply_nested_bodies(http: Http, depth: int) -> None:
    nested = b'{"a":' * depth + b"1" + b"}" * depth
    patch = b'{"metadata":{"annotations":' + nested + b"}}"
    for method, path, body, kind in (
        ("POST", PODS, nested, "application/json"),
        ("PATCH", f"{PODS}/p1", patch, "application/merge-patch+json"),
        ("PATCH", f"{PODS}/p1", patch, "application/strategic-merge-patch+json"),
    ):
        status(http(method, path, body, kind), 400)


def test_unknown_fields_are_refused_unless_asked(http: Http) -> None:
    body = {**POD, "metadata": {"name": "extra"}, "spec": {**POD["spec"], "nodeNmae": "n1"}}
    message = status(http("POST", PODS, body), 400, "BadRequest")
    assert 'unknown field "spec.nodeNmae"' in message
    ignored = http("POST", f"{PODS}?fieldValidation=Ignore", body)
    assert ignored.status == 201
    assert "nodeNmae" not in json.loads(ignored.data)["spec"]
    body["metadata"] = {"name": "extra2", "colour": "red"}
    warned = http("POST", f"{PODS}?fieldValidation=Warn", body)
    assert warned.status == 201
    assert "metadata.colour" in warned.headers["Warning"]
    status(http("POST", f"{PODS}?fieldValidation=Loud", POD), 400)


def test_wrong_types_and_invalid_objects(http: Http) -> None:
    status(http("POST", PODS, {**POD, "metadata": {"name": 5}}), 400)
    status(http("POST", PODS, {**POD, "spec": {"containers": "main"}}), 400)
    status(http("POST", PODS, {"metadata": {"name": "nocontainers"}, "spec": {}}), 422, "Invalid")
    status(http("POST", PODS, {**POD, "metadata": {"name": "Bad_Name"}}), 422, "Invalid")
    status(http("POST", PODS, {**POD, "kind": "Node"}), 400)
    status(http("POST", PODS, {**POD, "apiVersion": "v2"}), 400)
    status(http("POST", PODS, {**POD, "metadata": {"name": "x", "namespace": "other"}}), 400)
    status(http("PUT", f"{PODS}/p1", {**POD, "metadata": {"name": "p2"}}), 400)


def test_patch_errors(http: Http) -> None:
    patch = {"metadata": {"labels": {"a": "b"}}}
    assert "application/apply-patch+yaml" in status(http("PATCH", f"{PODS}/p1", patch, "text/plain"), 415,
                                                    "UnsupportedMediaType")  # fmt: skip
    status(http("PATCH", f"{PODS}/p1", [1], "application/merge-patch+json"), 400)
    json_patch = "application/json-patch+json"
    status(http("PATCH", f"{PODS}/p1", [{"op": "jump", "path": "/a"}], json_patch), 400)
    status(http("PATCH", f"{PODS}/p1", [{"op": "remove", "path": "/nope"}], json_patch), 422)
    status(http("PATCH", f"{PODS}/p1", {"op": "add"}, json_patch), 400)
    status(http("PATCH", f"{PODS}/gone", patch, "application/merge-patch+json"), 404, "NotFound")
    bad_type = {"metadata": {"labels": "oops"}}
    status(http("PATCH", f"{PODS}/p1", bad_type, "application/merge-patch+json"), 400)
    node = {"spec": {"nodeName": "elsewhere"}}
    status(http("PATCH", f"{PODS}/p1", node, "application/merge-patch+json"), 422)
    restart = {"spec": {"restartPolicy": "Never"}}
    assert "Forbidden" in status(http("PATCH", f"{PODS}/p1", restart, "application/merge-patch+json"), 422)


def test_pod_update_may_change_images_and_omit_defaults(http: Http) -> None:
    body = {"metadata": {"name": "p1", "labels": {"v": "2"}},
            "spec": {"containers": [{"name": "main", "image": "y"}], "activeDeadlineSeconds": 5}}
    answer = http("PUT", f"{PODS}/p1", body)
    assert answer.status == 200, answer.data
    spec = json.loads(answer.data)["spec"]
    assert spec["containers"][0]["image"] == "y" and spec["restartPolicy"] == "Always"


@pytest.mark.parametrize(
    "query",
    [
        "labelSelector=a%20in%20(b",
        "labelSelector=%3Dvalue",
        "labelSelector=a%3D%3D%3Db",
        "fieldSelector=spec.nodeName",
        "fieldSelector=spec.colour%3Dred",
        "watch=maybe",
        "watch=1&resourceVersion=abc",
        "limit=ten",
        "continue=%25%25%25",
        "timeoutSeconds=soon",
    ],
)
def test_bad_query_parameters(http: Http, query: str) -> None:
    status(http("GET", f"{PODS}?{query}"), 400, "BadRequest")


def test_unknown_paths_and_methods(http: Http) -> None:
    status(http("GET", "/api/v1/namespaces/default/widgets"), 404, "NotFound")
    status(http("GET", "/api/v1/pods/p1"), 404)
    status(http("GET", f"{PODS}/p1/logs"), 404)
    status(http("GET", "/apis/example.com/v1/things"), 404)
    status(http("GET", "/nowhere"), 404)
    status(http("PUT", PODS, POD), 405, "MethodNotAllowed")
    status(http("POST", "/api/v1/pods", POD), 405)
    status(http("DELETE", f"{PODS}/p1", b"[]"), 400)
    status(http("DELETE", f"{PODS}/p1", {"gracePeriodSeconds": "now"}), 400)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
pod_like = st.fixed_dictionaries(
    {"metadata": st.fixed_dictionaries({"name": st.just("fuzz")}, optional={"labels": json_values})},
    optional={"spec": json_values, "status": json_values, "kind": json_values},
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(["POST", "PUT", "PATCH"]),
    body=json_values | pod_like | st.binary(max_size=40),
    content_type=st.sampled_from(
        ["application/json", "application/merge-patch+json",
         "application/strategic-merge-patch+json", "application/json-patch+json", "text/plain"]
    ),
)
def test_fuzzed_bodies_never_fail_with_500(
    http: Http, method: str, body: Any, content_type: str
) -> None:
    path = PODS if method == "POST" else f"{PODS}/p1"
    response = http(method, path, body, content_type)
    assert response.status < 500, response.data
    if response.status >= 400:
        assert json.loads(response.data)["kind"] == "Status"
    if method == "POST" and response.status == 201:
        assert http("DELETE", f"{PODS}/fuzz").status == 200


query_values = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    params=st.dictionaries(
        st.sampled_from(["labelSelector", "fieldSelector", "watch", "resourceVersion", "limit",
                         "continue", "timeoutSeconds", "gracePeriodSeconds", "fieldValidation"]),
        query_values | st.integers(-(10**20), 10**20).map(str),
        max_size=4,
    ),
    method=st.sampled_from(["GET", "DELETE"]),
)
def test_fuzzed_queries_never_fail_with_500(http: Http, params: dict[str, str], method: str) -> None:
    if params.get("watch") and method == "GET":
        params["timeoutSeconds"] = "1"
        params["watch"] = "0"  # a long-lived stream is not what this test is about
    path = PODS if method == "GET" else f"{PODS}/fuzz"
    response = http.pool.request(method, http.url + path, fields=params)
    assert response.status < 500, response.data


def test_huge_grace_period_is_clamped(http: Http) -> None:
    body = {"metadata": {"name": "long"}, "spec": {**POD["spec"], "nodeName": "node-1"}}
    assert http("POST", PODS, body).status == 201
    answer = http("DELETE", f"{PODS}/long?gracePeriodSeconds={10**20}")
    assert answer.status == 200, answer.data
    assert json.loads(answer.data)["metadata"]["deletionGracePeriodSeconds"] == 10**9
    assert http("DELETE", f"{PODS}/long?gracePeriodSeconds=0").status == 200


NEW_PATHS = [
    ("POST", "/apis/authentication.k8s.io/v1/tokenreviews"),
    ("POST", "/api/v1/namespaces/default/serviceaccounts/default/token"),
    ("POST", "/api/v1/namespaces"),
    ("POST", "/api/v1/namespaces/default/pods/p1/eviction"),
    ("POST", "/apis/resource.k8s.io/v1/resourceslices"),
    ("POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"),
    ("PATCH", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/fuzz/status"),
    ("POST", "/apis/resource.k8s.io/v1alpha3/devicetaintrules"),
    ("DELETE", "/api/v1/namespaces/fuzz"),
]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    target=st.sampled_from(NEW_PATHS),
    body=json_values | pod_like | st.binary(max_size=40),
    content_type=st.sampled_from(["application/json", "application/merge-patch+json",
                                  "application/vnd.kubernetes.protobuf", "text/plain"]),
)  # fmt: skip
def test_fuzzed_bodies_on_tokens_namespaces_and_resources(
    http: Http, target: tuple[str, str], body: Any, content_type: str
) -> None:
    method, path = target
    response = http(method, path, body, content_type)
    assert response.status < 500, response.data
    if response.status >= 400:
        assert json.loads(response.data)["kind"] == "Status"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    params=st.dictionaries(
        st.sampled_from(["container", "follow", "previous", "tailLines", "limitBytes", "timestamps",
                         "sinceSeconds", "includeObject"]),
        query_values | st.integers(-(10**20), 10**20).map(str),
        max_size=4,
    ),
)  # fmt: skip
def test_fuzzed_log_and_table_queries(http: Http, params: dict[str, str]) -> None:
    response = http.pool.request("GET", f"{http.url}{PODS}/p1/log", fields=params)
    assert response.status < 500, response.data  # p1 is on no node: 400 (or 422 for a bad number)
    assert json.loads(response.data)["kind"] == "Status"
    table = "application/json;as=Table;v=v1;g=meta.k8s.io"
    response = http.pool.request("GET", f"{http.url}{PODS}", fields=params, headers={"Accept": table})
    assert response.status < 500, response.data


def test_server_side_apply_refusals(http: Http) -> None:
    apply = "application/apply-patch+yaml"
    status(http("PATCH", f"{PODS}/p1", POD, apply), 422, "Invalid")  # no fieldManager
    status(http("PATCH", f"{PODS}/p1?fieldManager=t", b"a: [1", apply), 400, "BadRequest")
    status(http("PATCH", f"{PODS}/p1?fieldManager=t", b"- 1", apply), 400, "BadRequest")
    status(http("PATCH", f"{PODS}/p1/status?fieldManager=t", POD, apply), 415, "UnsupportedMediaType")
    status(http("PATCH", f"{PODS}/p1?fieldManager=t", {**POD, "metadata": {"name": "p2"}}, apply), 400)
    status(http("PATCH", "/api/v1/namespaces/none/pods/p9?fieldManager=t", {**POD, "metadata": {"name": "p9"}},
                apply), 404, "NotFound")  # fmt: skip
