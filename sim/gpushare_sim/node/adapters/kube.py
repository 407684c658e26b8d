"""Kubernetes API access for the node simulator and the scheduler, through the
official client (synchronous, so every call runs in a thread).

Objects travel as their JSON form (plain dicts).  Errors: :class:`NotFound`,
:class:`Conflict`, :class:`Retryable` (all :class:`KubeError`); nothing from
the client escapes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import urllib3
from gpushare_common.adapters.kube import Kube
from gpushare_common.settings import KubeSettings
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

T = TypeVar("T")
MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT = 10.0


def _key(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


class KubeError(Exception):
    def __init__(self, action: str, status: int, reason: str) -> None:
        self.action = action
        self.status = status
        super().__init__(f"{action}: {status} {reason}".strip())


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class Retryable(KubeError):
    pass


def _error(action: str, err: Exception) -> KubeError:
    if isinstance(err, ApiException):
        status = int(err.status or 0)
        reason = str(err.reason or "")
        if status == 404:
            return NotFound(action, status, reason)
        if status == 409:
            return Conflict(action, status, reason)
        return Retryable(action, status, f"{reason} {str(err.body or '')[:300]}")
    return Retryable(action, 0, repr(err))


class KubeApi:
    def __init__(self, api_client: Any) -> None:
        self._core = client.CoreV1Api(api_client)
        self._client = api_client
        self._watcher = Kube(KubeSettings(), api_client)

    @classmethod
    def from_kubeconfig(cls, path: str) -> KubeApi:
        return cls(config.new_client_from_config(config_file=path))

    def close(self) -> None:
        self._client.close()

    async def _call(self, action: str, fn: Callable[[], T]) -> T:
        try:
            return await asyncio.to_thread(fn)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as err:
            raise _error(action, err) from None

    async def _json(self, action: str, fn: Callable[[], Any]) -> Any:
        response = await self._call(action, fn)
        return json.loads(response.data) if response.data else {}

    # --- nodes ---------------------------------------------------------------

    async def ensure_node(self, name: str, labels: dict[str, str]) -> None:
        body: Any = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
        try:
            await self._call(f"create node {name}", lambda: self._core.create_node(
                body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
        except Conflict:
            patch = {"metadata": {"labels": labels}}
            await self._call(f"label node {name}", lambda: self._core.patch_node(
                name, patch, _content_type=MERGE_PATCH, _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT))  # fmt: skip

    async def patch_node_status(self, name: str, status: dict[str, Any]) -> None:
        await self._call(f"patch node status {name}", lambda: self._core.patch_node_status(
            name, {"status": status}, _content_type=MERGE_PATCH, _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT))  # fmt: skip

    async def list_nodes(self) -> list[dict[str, Any]]:
        body = await self._json("list nodes", lambda: self._core.list_node(
            _preload_content=False, _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
        return list(body.get("items") or [])

    # --- pods ----------------------------------------------------------------

    async def list_pods(self, node: str | None = None) -> list[dict[str, Any]]:
        selector = f"spec.nodeName={node}" if node is not None else None
        kwargs: dict[str, Any] = {"field_selector": selector} if selector else {}
        body = await self._json("list pods", lambda: self._core.list_pod_for_all_namespaces(
            _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs))  # fmt: skip
        items = list(body.get("items") or [])
        if node is None:
            return items
        return [p for p in items if (p.get("spec") or {}).get("nodeName") == node]

    async def watch_node_pods(self, node: str, stop: asyncio.Event) -> AsyncIterator[list[dict[str, Any]]]:
        """The full set of pods bound to ``node``, again after every change (list + watch)."""
        pods: dict[str, dict[str, Any]] = {}
        selector = f"spec.nodeName={node}"
        async for change in self._watcher.watch_pods(stop, field_selector=selector):
            if change.kind == "SYNC":
                pods = {_key(p): p for p in change.pods}
            elif change.pod is not None and change.kind == "DELETED":
                pods.pop(_key(change.pod), None)
            elif change.pod is not None:
                pods[_key(change.pod)] = change.pod
            yield [p for p in pods.values() if (p.get("spec") or {}).get("nodeName") == node]

    async def patch_pod_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        await self._call(f"patch pod status {namespace}/{name}",
                         lambda: self._core.patch_namespaced_pod_status(
            name, namespace, {"status": status}, _content_type=MERGE_PATCH,
            _preload_content=False, _request_timeout=REQUEST_TIMEOUT))  # fmt: skip

    async def delete_pod(self, namespace: str, name: str) -> None:
        """Delete with grace 0 (the kubelet's confirmation); a missing pod is fine."""
        try:
            await self._call(f"delete pod {namespace}/{name}",
                             lambda: self._core.delete_namespaced_pod(
                name, namespace, grace_period_seconds=0, _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
        except NotFound:
            pass

    async def bind_pod(self, namespace: str, name: str, node: str) -> None:
        body: Any = {
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }  # fmt: skip
        await self._call(f"bind pod {namespace}/{name} to {node}",
                         lambda: self._core.create_namespaced_pod_binding(
            name, namespace, body, _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
