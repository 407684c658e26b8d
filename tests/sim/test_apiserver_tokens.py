"""Service-account tokens: TokenRequest (audiences, expiry, binding to a Pod or a Node)
and TokenReview answering as the API server does for bound tokens — through the
official client and raw HTTP, including every refused case."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from gpushare_sim.apiserver import authn, tokens
from gpushare_sim.apiserver.store import Store
from kubernetes import client
from kubernetes.client import ApiException

from tests.support.kubeapi import KubeApi, pod_manifest

EXTRA = "authentication.kubernetes.io/"
AUDIENCE = "gpushare.k8s.io"


@pytest.fixture
def core(kube_api: KubeApi) -> client.CoreV1Api:
    api = client.CoreV1Api(kube_api.client)
    api.create_namespaced_service_account("gpushare-system", {"metadata": {"name": "deviceplugin"}})
    api.create_node({"metadata": {"name": "node-1"}})
    return api


@pytest.fixture
def auth(kube_api: KubeApi) -> client.AuthenticationV1Api:
    return client.AuthenticationV1Api(kube_api.client)


def request_token(core: client.CoreV1Api, spec: dict[str, Any], account: str = "deviceplugin",
                  namespace: str = "gpushare-system") -> Any:  # fmt: skip
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    return core.create_namespaced_service_account_token(account, namespace, body)


def review(auth: client.AuthenticationV1Api, token: str, audiences: list[str] | None = None) -> Any:
    spec: dict[str, Any] = {"token": token}
    if audiences is not None:
        spec["audiences"] = audiences
    return auth.create_token_review({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec})


def claims_of(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return decoded


def node_ref(core: client.CoreV1Api, name: str = "node-1") -> dict[str, str]:
    return {"apiVersion": "v1", "kind": "Node", "name": name, "uid": core.read_node(name).metadata.uid}


def test_node_bound_token_and_its_review(core: client.CoreV1Api, auth: client.AuthenticationV1Api) -> None:
    answer = request_token(core, {"audiences": [AUDIENCE], "expirationSeconds": 900,
                                  "boundObjectRef": node_ref(core)})  # fmt: skip
    token, node_uid = answer.status.token, core.read_node("node-1").metadata.uid
    account_uid = core.read_namespaced_service_account("deviceplugin", "gpushare-system").metadata.uid
    claims = claims_of(token)
    assert set(claims) == {"aud", "exp", "iat", "nbf", "iss", "jti", "kubernetes.io", "sub"}
    assert claims["aud"] == [AUDIENCE] and claims["exp"] - claims["iat"] == 900
    assert claims["sub"] == "system:serviceaccount:gpushare-system:deviceplugin"
    assert claims["kubernetes.io"] == {"namespace": "gpushare-system",
                                       "serviceaccount": {"name": "deviceplugin", "uid": account_uid},
                                       "node": {"name": "node-1", "uid": node_uid}}  # fmt: skip
    status = review(auth, token, [AUDIENCE, "other"]).status
    assert status.authenticated is True and status.audiences == [AUDIENCE]
    assert status.user.username == "system:serviceaccount:gpushare-system:deviceplugin"
    assert status.user.uid == account_uid
    assert status.user.groups == ["system:serviceaccounts", "system:serviceaccounts:gpushare-system",
                                  "system:authenticated"]  # fmt: skip
    assert status.user.extra == {f"{EXTRA}node-name": ["node-1"], f"{EXTRA}node-uid": [node_uid],
                                 f"{EXTRA}credential-id": [f"JTI={claims['jti']}"]}  # fmt: skip


def test_pod_bound_token_carries_the_pods_node(core: client.CoreV1Api, auth: client.AuthenticationV1Api) -> None:
    pod = core.create_namespaced_pod("gpushare-system", {**pod_manifest("dp-1", node="node-1"), "spec": {
        **pod_manifest("dp-1", node="node-1")["spec"], "serviceAccountName": "deviceplugin"}})  # fmt: skip
    ref = {"apiVersion": "v1", "kind": "Pod", "name": "dp-1", "uid": pod.metadata.uid}
    token = request_token(core, {"boundObjectRef": ref}).status.token
    status = review(auth, token).status  # no audiences: the API server's own
    assert status.authenticated and status.audiences == [tokens.ISSUER]
    extra = status.user.extra
    assert extra[f"{EXTRA}pod-name"] == ["dp-1"] and extra[f"{EXTRA}pod-uid"] == [pod.metadata.uid]
    assert extra[f"{EXTRA}node-name"] == ["node-1"]
    assert extra[f"{EXTRA}node-uid"] == [core.read_node("node-1").metadata.uid]
    assert claims_of(token)["exp"] - claims_of(token)["iat"] == authn.DEFAULT_EXPIRATION_S


def unauthenticated(auth: client.AuthenticationV1Api, token: str, audiences: list[str] | None = None) -> str:
    status = review(auth, token, audiences).status
    assert not status.authenticated and status.user.username is None
    return str(status.error)


def test_refused_tokens(core: client.CoreV1Api, auth: client.AuthenticationV1Api, kube_api: KubeApi) -> None:
    token = request_token(core, {"audiences": [AUDIENCE], "boundObjectRef": node_ref(core)}).status.token
    assert "token audiences ['gpushare.k8s.io'] is invalid" in unauthenticated(auth, token, ["someone-else"])
    head, payload, signature = token.split(".")
    forged = dict(claims_of(token), sub="system:serviceaccount:kube-system:admin")
    forged_payload = base64.urlsafe_b64encode(json.dumps(forged).encode()).rstrip(b"=").decode()
    assert "signature does not verify" in unauthenticated(auth, f"{head}.{forged_payload}.{signature}", [AUDIENCE])
    flipped = signature[:-2] + ("AA" if signature[-2:] != "AA" else "BB")
    assert "signature does not verify" in unauthenticated(auth, f"{head}.{payload}.{flipped}", [AUDIENCE])
    assert "not a JWT" in unauthenticated(auth, "gpushare-sim")
    stale = dict(claims_of(token), exp=int(time.time()) - 2 * authn.LEEWAY_S)
    expired = kube_api.server.call(lambda store: tokens.sign(stale, store.signing_key), kube_api.store)
    assert "expired" in unauthenticated(auth, expired, [AUDIENCE])
    assert review(auth, token, [AUDIENCE]).status.authenticated  # still good until its node goes
    core.delete_node("node-1")
    assert "invalidated" in unauthenticated(auth, token, [AUDIENCE])
    core.create_node({"metadata": {"name": "node-1"}})  # same name, another uid
    assert "node UID" in unauthenticated(auth, token, [AUDIENCE])


def test_pod_deleted_or_recreated_invalidates(core: client.CoreV1Api, auth: client.AuthenticationV1Api) -> None:
    pod = core.create_namespaced_pod("default", pod_manifest("user"))
    ref = {"apiVersion": "v1", "kind": "Pod", "name": "user", "uid": pod.metadata.uid}
    token = request_token(core, {"boundObjectRef": ref}, account="default", namespace="default").status.token
    assert review(auth, token).status.authenticated
    core.delete_namespaced_pod("user", "default")
    assert "invalidated" in unauthenticated(auth, token)
    core.create_namespaced_pod("default", pod_manifest("user"))
    assert "pod UID" in unauthenticated(auth, token)
    core.delete_namespaced_service_account("default", "default")
    core.create_namespaced_service_account("default", {"metadata": {"name": "default"}})
    assert "service account UID" in unauthenticated(auth, token)


def refused(core: client.CoreV1Api, spec: dict[str, Any], code: int, account: str = "deviceplugin") -> str:
    with pytest.raises(ApiException) as error:
        request_token(core, spec, account=account)
    assert error.value.status == code, error.value.body
    body = json.loads(error.value.body)
    assert body["kind"] == "Status" and body["code"] == code
    return str(body["message"])


def test_token_requests_refused(core: client.CoreV1Api) -> None:
    assert "less than 10 minutes" in refused(core, {"expirationSeconds": 60}, 422)
    assert "larger than 2^32 seconds" in refused(core, {"expirationSeconds": 1 << 33}, 422)
    assert 'serviceaccounts "ghost" not found' in refused(core, {}, 404, account="ghost")
    secret = {"boundObjectRef": {"kind": "Secret", "name": "s"}}
    assert "cannot bind token to object of type" in refused(core, secret, 400)
    assert 'nodes "node-9" not found' in refused(core, {"boundObjectRef": {"kind": "Node", "name": "node-9"}}, 404)
    wrong = {"kind": "Node", "apiVersion": "v1", "name": "node-1", "uid": "not-its-uid"}
    assert "does not match the UID in record" in refused(core, {"boundObjectRef": wrong}, 409)
    core.create_namespaced_pod("gpushare-system", pod_manifest("other-sa"))
    pod_ref = {"kind": "Pod", "apiVersion": "v1", "name": "other-sa"}
    assert "different serviceaccount name" in refused(core, {"boundObjectRef": pod_ref}, 400)


def raw(kube_api: KubeApi, path: str, body: Any, method: str = "POST") -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"{kube_api.url}{path}", data=json.dumps(body).encode(), method=method,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_raw_http_review_and_refusals(core: client.CoreV1Api, kube_api: KubeApi) -> None:
    path = "/api/v1/namespaces/gpushare-system/serviceaccounts/deviceplugin/token"
    code, issued = raw(kube_api, path, {"spec": {"audiences": [AUDIENCE]}})
    assert code == 201 and issued["kind"] == "TokenRequest" and issued["status"]["expirationTimestamp"]
    reviews = "/apis/authentication.k8s.io/v1/tokenreviews"
    code, answer = raw(kube_api, reviews, {"spec": {"token": issued["status"]["token"], "audiences": [AUDIENCE]}})
    assert code == 201 and answer["status"]["authenticated"] is True
    code, answer = raw(kube_api, reviews, {"spec": {"token": "x.y.z"}})
    assert code == 201 and "authenticated" not in answer["status"] and answer["status"]["error"]
    assert raw(kube_api, reviews, {"spec": {}})[0] == 422
    assert raw(kube_api, reviews, {"spec": {"token": 5}})[0] == 400
    assert raw(kube_api, reviews, {}, method="PUT")[0] == 405
    assert raw(kube_api, path, {"spec": {"expirationSeconds": "soon"}})[0] == 400


def test_claims_signed_in_process_verify(kube_api: KubeApi) -> None:
    def round_trip(store: Store) -> dict[str, Any]:
        return tokens.verify(tokens.sign({"a": 1}, store.signing_key), store.signing_key)

    assert kube_api.server.call(round_trip, kube_api.store) == {"a": 1}
    other = tokens.SigningKey.generate()
    with pytest.raises(tokens.TokenError):
        kube_api.server.call(lambda store: tokens.verify(tokens.sign({"a": 1}, other), store.signing_key),
                             kube_api.store)  # fmt: skip
