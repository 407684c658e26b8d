"""TokenRequest (`serviceaccounts/<name>/token`) and TokenReview, as the API server
answers them for bound service-account tokens.

A token carries the service account, and optionally the Pod it is bound to
(with that pod's Node, KEP-4193) or a Node. A review authenticates it only
while the signature, issuer, expiry (60 s leeway, as the API server allows),
audience and every bound object (same name and uid, not deleted for more
than 60 s) still hold; the user's `extra` then names the pod, the node and the
token's credential id.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from . import errors
from .kinds import NODES, PODS, SERVICEACCOUNTS
from .objects import now_rfc3339
from .printers import timestamp
from .store import Entry, Obj, Store
from .tokens import API_AUDIENCES, ISSUER, TokenError, sign, verify

LEEWAY_S = 60
DEFAULT_EXPIRATION_S = 3600
_MIN_EXPIRATION_S, _MAX_EXPIRATION_S = 600, 1 << 32
EXTRA = "authentication.kubernetes.io/"
_INVALIDATED = "service account token has been invalidated"


def _invalid(name: str, field: str, message: str) -> errors.ApiError:
    return errors.invalid("TokenRequest.authentication.k8s.io", name, [(field, message)])


def _expiration(name: str, spec: Obj) -> int:
    seconds = spec.get("expirationSeconds", DEFAULT_EXPIRATION_S)
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise _invalid(name, "spec.expirationSeconds", f"Invalid value: {seconds!r}: must be an integer")
    if seconds < _MIN_EXPIRATION_S:
        raise _invalid(name, "spec.expirationSeconds",
                       f"Invalid value: {seconds}: may not specify a duration less than 10 minutes")  # fmt: skip
    if seconds > _MAX_EXPIRATION_S:
        raise _invalid(name, "spec.expirationSeconds",
                       f"Invalid value: {seconds}: may not specify a duration larger than 2^32 seconds")  # fmt: skip
    return seconds


def _ref(entry: Entry) -> dict[str, str]:
    meta = entry.obj["metadata"]
    return {"name": meta["name"], "uid": meta["uid"]}


def _bound(store: Store, namespace: str, account: str, ref: Obj) -> dict[str, Any]:
    """The private claims for `boundObjectRef` (Pod, with its node; or Node)."""
    kind, name, uid = ref.get("kind"), ref.get("name") or "", ref.get("uid") or ""
    if ref.get("apiVersion") not in (None, "", "v1") or kind not in ("Pod", "Node"):
        raise errors.bad_request(f"cannot bind token to object of type {ref.get('apiVersion', '')}, Kind={kind}: "
                                 "only v1 Pod and v1 Node are supported")  # fmt: skip
    entry = store.get(PODS if kind == "Pod" else NODES, (namespace if kind == "Pod" else "", name))
    if entry is None:
        raise errors.not_found("pods" if kind == "Pod" else "nodes", name)
    if uid and uid != entry.obj["metadata"]["uid"]:
        raise errors.conflict(kind, name, f"the UID in the bound object reference ({uid}) does not match the UID "
                              "in record. The object might have been deleted and then recreated")  # fmt: skip
    if kind == "Node":
        return {"node": _ref(entry)}
    if (entry.obj.get("spec") or {}).get("serviceAccountName", "default") != account:
        raise errors.bad_request(f'cannot bind token for serviceaccount "{account}" to pod running with '
                                 "different serviceaccount name.")  # fmt: skip
    claims: dict[str, Any] = {"pod": _ref(entry)}
    node = store.get(NODES, ("", (entry.obj.get("spec") or {}).get("nodeName") or ""))
    if node is not None:
        claims["node"] = _ref(node)
    return claims


def issue(store: Store, namespace: str, account: str, request: Obj) -> Obj:
    """Answer a TokenRequest for ServiceAccount `namespace/account`."""
    entry = store.get(SERVICEACCOUNTS, (namespace, account))
    if entry is None:
        raise errors.not_found("serviceaccounts", account)
    spec = dict(request.get("spec") or {})
    seconds = _expiration(account, spec)
    audiences = list(spec.get("audiences") or API_AUDIENCES)
    private: dict[str, Any] = {"namespace": namespace, "serviceaccount": _ref(entry)}
    if spec.get("boundObjectRef"):
        private |= _bound(store, namespace, account, spec["boundObjectRef"])
    now = int(time.time())
    claims = {"aud": audiences, "exp": now + seconds, "iat": now, "nbf": now, "iss": ISSUER,
              "jti": str(uuid.uuid4()), "kubernetes.io": private,
              "sub": f"system:serviceaccount:{namespace}:{account}"}  # fmt: skip
    return {
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": account, "namespace": namespace, "creationTimestamp": now_rfc3339()},
        "spec": {**spec, "audiences": audiences, "expirationSeconds": seconds},
        "status": {"token": sign(claims, store.signing_key), "expirationTimestamp": now_rfc3339(seconds)},
    }


class Unauthenticated(Exception):
    """Why a token does not authenticate (the TokenReview's status.error)."""


def review(store: Store, body: Obj) -> Obj:
    """Answer a TokenReview: who the token is, or why it is no one."""
    spec = body.get("spec") or {}
    token = spec.get("token")
    if not isinstance(token, str) or not token:
        raise errors.invalid("TokenReview.authentication.k8s.io", "", [("spec.token", "Required value")])
    wanted = list(spec.get("audiences") or API_AUDIENCES)
    answer = {"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
              "metadata": {"creationTimestamp": None}, "spec": spec}  # fmt: skip
    try:
        claims = _claims(store, token)
        audiences = [a for a in wanted if a in claims.get("aud", [])]
        if not audiences:
            raise Unauthenticated(f"token audiences {claims.get('aud')} is invalid for the target audiences {wanted}")
        user = _user(store, claims)
    except Unauthenticated as why:
        return {**answer, "status": {"user": {}, "error": f"[invalid bearer token, {why}]"}}
    return {**answer, "status": {"authenticated": True, "user": user, "audiences": audiences}}


def authenticate(store: Store, authorization: str) -> Obj:
    """The user an ``Authorization: Bearer`` header names, or a 401 ApiError (the API audiences)."""
    scheme, _, token = authorization.partition(" ")
    try:
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("no bearer token")
        claims = _claims(store, token.strip())
        if not set(API_AUDIENCES) & set(claims.get("aud", [])):
            raise Unauthenticated(f"token audiences {claims.get('aud')} are not the API's")
        return _user(store, claims)
    except Unauthenticated as why:
        raise errors.ApiError(401, "Unauthorized", reason="Unauthorized") from why


def _claims(store: Store, token: str) -> dict[str, Any]:
    try:
        claims = verify(token, store.signing_key)
    except TokenError as error:
        raise Unauthenticated(str(error)) from None
    if claims.get("iss") != ISSUER:
        raise Unauthenticated(f"token issuer {claims.get('iss')!r} is not {ISSUER!r}")
    now = time.time()
    if not isinstance(claims.get("exp"), int) or now > claims["exp"] + LEEWAY_S:
        raise Unauthenticated("service account token has expired")
    if isinstance(claims.get("nbf"), int) and now < claims["nbf"] - LEEWAY_S:
        raise Unauthenticated("service account token is not valid yet")
    if isinstance(claims.get("aud"), str):
        claims["aud"] = [claims["aud"]]
    return claims


def _current(store: Store, kind: Any, key: tuple[str, str], ref: Any, what: str) -> Entry:
    """The bound object, if it is still the one the token names and not deleted long ago."""
    if not isinstance(ref, dict):
        raise Unauthenticated(f"malformed {what} claim")
    entry = store.get(kind, key)
    if entry is None:
        raise Unauthenticated(_INVALIDATED)
    meta = entry.obj["metadata"]
    if meta["uid"] != ref.get("uid"):
        raise Unauthenticated(f"{what} UID ({meta['uid']}) does not match service account {what} ref claim "
                              f"({ref.get('uid')})")  # fmt: skip
    deleted = timestamp(meta.get("deletionTimestamp"))
    if deleted is not None and deleted < time.time() - LEEWAY_S:
        raise Unauthenticated(_INVALIDATED)
    return entry


def _user(store: Store, claims: dict[str, Any]) -> Obj:
    private = claims.get("kubernetes.io")
    if not isinstance(private, dict) or not isinstance(private.get("serviceaccount"), dict):
        raise Unauthenticated("the token carries no service account")
    namespace, account = str(private.get("namespace", "")), private["serviceaccount"]
    entry = store.get(SERVICEACCOUNTS, (namespace, str(account.get("name", ""))))
    if entry is None:
        raise Unauthenticated(f'serviceaccounts "{account.get("name")}" not found')
    if entry.obj["metadata"]["uid"] != account.get("uid"):
        raise Unauthenticated(f"service account UID ({entry.obj['metadata']['uid']}) does not match claim "
                              f"({account.get('uid')})")  # fmt: skip
    extra: dict[str, list[str]] = {}
    pod, node = private.get("pod"), private.get("node")
    if pod is not None:
        _current(store, PODS, (namespace, str((pod or {}).get("name", ""))), pod, "pod")
        extra |= {f"{EXTRA}pod-name": [pod["name"]], f"{EXTRA}pod-uid": [pod["uid"]]}
    elif node is not None:
        _current(store, NODES, ("", str((node or {}).get("name", ""))), node, "node")
    if isinstance(node, dict) and node.get("name"):
        extra[f"{EXTRA}node-name"] = [node["name"]]
        if node.get("uid"):
            extra[f"{EXTRA}node-uid"] = [node["uid"]]
    if claims.get("jti"):
        extra[f"{EXTRA}credential-id"] = [f"JTI={claims['jti']}"]
    name = account["name"]
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]
    return {"username": f"system:serviceaccount:{namespace}:{name}", "uid": account["uid"], "groups": groups,
            "extra": extra}  # fmt: skip
