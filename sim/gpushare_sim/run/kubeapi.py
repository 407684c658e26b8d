"""What the local cluster runner does through the Kubernetes API: the namespaces the
scenarios use, and service-account tokens for the services.

`mint_node_token(kubeconfig, node, "gpushare-deviceplugin")` makes sure the
ServiceAccount exists in `gpushare-system`, then asks for a token bound to the
Node (KEP-4193): the API server's TokenReview then tells whoever receives it
which node's service sent it, and the token stops authenticating once that
Node object is gone or replaced.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client import ApiException

SERVICES_NAMESPACE = "gpushare-system"


class ApiRefused(Exception):
    """The API refused what the runner asked; the message is its answer."""


@dataclass(frozen=True, slots=True)
class NodeToken:
    token: str
    expires: str  # RFC 3339
    service_account: str
    node: str


def _refused(what: str, error: ApiException) -> ApiRefused:
    try:
        message = json.loads(error.body or "{}").get("message") or error.reason
    except ValueError:
        message = error.reason
    return ApiRefused(f"{what}: {error.status} {message}")


def ensure_namespace(kubeconfig: Path, name: str) -> None:
    """Create namespace `name` unless it exists (blocking: call it in a thread)."""
    api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        core: Any = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": name}}, _preload_content=False)
    except ApiException as error:
        if error.status != 409:
            raise _refused(f"create namespace {name}", error) from None
    finally:
        api.close()


def _ensure_account(core: Any, namespace: str, name: str) -> None:
    try:
        core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    except ApiException as error:
        if error.status != 409:
            raise _refused(f"create serviceaccount {namespace}/{name}", error) from None


def mint_node_token(
    kubeconfig: Path,
    node: str,
    service_account: str,
    *,
    namespace: str = SERVICES_NAMESPACE,
    audiences: Sequence[str] = (),
    expiration_s: int = 3600,
) -> NodeToken:
    """A token of `namespace/service_account` bound to Node `node` (blocking: call it in a thread)."""
    return mint_token(kubeconfig, service_account, node=node, namespace=namespace, audiences=audiences,
                      expiration_s=expiration_s)  # fmt: skip


def mint_token(
    kubeconfig: Path,
    service_account: str,
    *,
    node: str = "",
    namespace: str = SERVICES_NAMESPACE,
    audiences: Sequence[str] = (),
    expiration_s: int = 3600,
) -> NodeToken:
    """A token of `namespace/service_account`, bound to Node `node` when one is given (a service that
    acts for no node, such as the console, gets an unbound one). Blocking: call it in a thread."""
    api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        core: Any = client.CoreV1Api(api)  # raw answers (_preload_content=False)
        _ensure_account(core, namespace, service_account)
        spec: dict[str, Any] = {"expirationSeconds": expiration_s}
        if node:
            try:
                uid = json.loads(core.read_node(node, _preload_content=False).data)["metadata"]["uid"]
            except ApiException as error:
                raise _refused(f"read node {node}", error) from None
            spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}
        if audiences:
            spec["audiences"] = list(audiences)
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        try:
            answer = core.create_namespaced_service_account_token(service_account, namespace, body,
                                                                  _preload_content=False)  # fmt: skip
        except ApiException as error:
            raise _refused(f"request a token for {namespace}/{service_account}", error) from None
        status = json.loads(answer.data)["status"]
        return NodeToken(str(status["token"]), str(status["expirationTimestamp"]), service_account, node)
    finally:
        api.close()
