"""The Kubernetes adapter: the only place that talks to the Kubernetes API.

The official ``kubernetes`` package does the talking (:mod:`.kubeclient`: its configuration
loaders, its ``ApiClient`` on an executor, its ``Watch``); objects are plain dicts in the API's
JSON shape, decoded with msgspec. Errors are the adapter's own tree (raised in :mod:`.kubeclient`,
exported here): :class:`NotFound`,
:class:`Conflict`, :class:`Gone`, :class:`Invalid`, :class:`Retryable` (5xx, 429, 401/403,
timeouts, connection errors, TLS failures); no exception of the package or of urllib3 escapes.
A configuration that cannot be used is :class:`KubeConfigError`, when the :class:`Kube` is made.

:meth:`Kube.watch_pods` lists, then watches from the list's resourceVersion with bookmarks,
resumes from the last version seen (an event's or a bookmark's), re-lists on ``410 Gone`` and
backs off on errors, yielding :class:`PodChange` items (a ``SYNC`` with the full list after
each (re)list, then ``ADDED``/``MODIFIED``/``DELETED``). Setting ``stop`` ends it promptly, a
watch blocked in its read included.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..logging import get_logger
from ..retry import Backoff, Supervised
from ..settings import KubeSettings
from .kubeclient import (
    Closed,
    Configuration,
    Conflict,
    Gone,
    Invalid,
    KubeClient,
    KubeConfigError,
    KubeError,
    NotFound,
    Retryable,
    query_of,
)

__all__ = ["Closed", "Conflict", "Gone", "Invalid", "Kube", "KubeConfigError", "KubeError", "NotFound", "PodChange",
           "Retryable", "resource_path"]

log = get_logger("kube")
Obj = dict[str, Any]
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


@dataclass(slots=True)
class PodChange:
    kind: str  # SYNC | ADDED | MODIFIED | DELETED
    pod: Obj | None = None
    pods: list[Obj] = field(default_factory=list)


def _pods_path(namespace: str | None, name: str = "", sub: str = "") -> str:
    base = f"/api/v1/namespaces/{_q(namespace)}/pods" if namespace else "/api/v1/pods"
    return base + (f"/{_q(name)}" if name else "") + (f"/{sub}" if sub else "")


def _leases_path(namespace: str, name: str = "") -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{_q(namespace)}/leases"
    return base + (f"/{_q(name)}" if name else "")


RESOURCE_API = "/apis/resource.k8s.io/v1"
TAINT_API = "/apis/resource.k8s.io/v1alpha3"  # DeviceTaintRule


def resource_path(plural: str, namespace: str = "", name: str = "", sub: str = "",
                  api: str = RESOURCE_API) -> str:
    """``/apis/resource.k8s.io/v1[/namespaces/<ns>]/<plural>[/<name>[/<sub>]]``."""
    base = f"{api}/namespaces/{_q(namespace)}/{plural}" if namespace else f"{api}/{plural}"
    return base + (f"/{_q(name)}" if name else "") + (f"/{sub}" if sub else "")


def _q(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


class Kube:
    """The API's calls this project makes, on the ``kubernetes`` package; :meth:`close` when done."""

    def __init__(self, settings: KubeSettings, configuration: Configuration | None = None) -> None:
        """:class:`KubeConfigError` (a setting, not a call) when the configuration cannot be used."""
        self.settings = settings
        self.client = KubeClient(settings, configuration)

    async def close(self) -> None:
        await self.client.close()

    async def _rest(self, what: str, method: str, path: str, body: Any = None,
                    content_type: str = "application/json", **query: Any) -> Any:
        """One call; the decoded JSON answer (None when empty)."""
        payload = await self._send(what, method, path, query_of(**query), body, content_type)
        try:
            return msgspec.json.decode(payload) if payload else None
        except msgspec.DecodeError as err:
            raise Retryable(f"{what}: the answer is not JSON: {err}") from None

    async def _send(self, what: str, method: str, path: str, query: list[tuple[str, str]], body: Any,
                    content_type: str) -> bytes:
        """The exchange: the answer's body, or the adapter's error for its status."""
        return await self.client.call(what, method, path, query, body, content_type)

    # --- pods -------------------------------------------------------------------

    async def list_pods(
        self, namespace: str | None = None, field_selector: str = "", label_selector: str = ""
    ) -> tuple[list[Obj], str]:
        doc = await self._rest("list pods", "GET", _pods_path(namespace),
                               field_selector=field_selector, label_selector=label_selector)
        return list(doc.get("items") or []), str(doc["metadata"].get("resourceVersion", ""))

    async def get_pod(self, namespace: str, name: str) -> Obj:
        return await self._rest(f"get pod {namespace}/{name}", "GET", _pods_path(namespace, name))  # type: ignore[no-any-return]

    async def create_pod(self, namespace: str, body: Obj) -> Obj:
        return await self._rest(f"create pod in {namespace}", "POST", _pods_path(namespace), body)  # type: ignore[no-any-return]

    async def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None,
                         uid: str = "") -> Obj | None:
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if uid:
            body["preconditions"] = {"uid": uid}
        return await self._rest(  # type: ignore[no-any-return]
            f"delete pod {namespace}/{name}", "DELETE", _pods_path(namespace, name), body)

    async def patch_pod(self, namespace: str, name: str, patch: Obj, strategic: bool = False) -> Obj:
        return await self._rest(  # type: ignore[no-any-return]
            f"patch pod {namespace}/{name}", "PATCH", _pods_path(namespace, name), patch,
            STRATEGIC if strategic else MERGE)

    async def patch_pod_status(self, namespace: str, name: str, patch: Obj, strategic: bool = True) -> Obj:
        return await self._rest(  # type: ignore[no-any-return]
            f"patch pod status {namespace}/{name}", "PATCH", _pods_path(namespace, name, "status"), patch,
            STRATEGIC if strategic else MERGE)

    async def create_event(self, namespace: str, body: Obj) -> None:
        await self._rest(f"create event in {namespace}", "POST", f"/api/v1/namespaces/{_q(namespace)}/events",
                         body)

    async def list_events(self, namespace: str, field_selector: str = "") -> list[Obj]:
        """The core/v1 Events of ``namespace`` (e.g. ``involvedObject.name=<pod>``)."""
        path = f"/api/v1/namespaces/{_q(namespace)}/events"
        return (await self._list_objects(path, field_selector))[0]

    # --- leases -----------------------------------------------------------------

    async def get_lease(self, namespace: str, name: str) -> Obj:
        return await self._rest(f"get lease {namespace}/{name}", "GET", _leases_path(namespace, name))  # type: ignore[no-any-return]

    async def create_lease(self, namespace: str, body: Obj) -> Obj:
        return await self._rest(f"create lease in {namespace}", "POST", _leases_path(namespace), body)  # type: ignore[no-any-return]

    async def replace_lease(self, namespace: str, name: str, body: Obj) -> Obj:
        return await self._rest(  # type: ignore[no-any-return]
            f"replace lease {namespace}/{name}", "PUT", _leases_path(namespace, name), body)

    # --- nodes ------------------------------------------------------------------

    async def get_node(self, name: str) -> Obj:
        return await self._rest(f"get node {name}", "GET", f"/api/v1/nodes/{_q(name)}")  # type: ignore[no-any-return]

    # --- authentication ---------------------------------------------------------

    async def review_token(self, token: str, audiences: list[str]) -> Obj:
        """A TokenReview of ``token`` for ``audiences``: its ``status`` (``authenticated``, ``user``,
        ``audiences``, ``error``); the API's refusal of the token is an answer, not an error."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token, "audiences": audiences}}  # fmt: skip
        doc = await self._rest("review a token", "POST", "/apis/authentication.k8s.io/v1/tokenreviews", body)
        return dict((doc or {}).get("status") or {})

    # --- resource.k8s.io: claims, slices, device taint rules -------------------------------

    async def _list_objects(self, path: str, field_selector: str = "", label_selector: str = ""
                            ) -> tuple[list[Obj], str]:
        doc = await self._rest(f"list {path}", "GET", path, field_selector=field_selector,
                               label_selector=label_selector)
        return list(doc.get("items") or []), str(doc["metadata"].get("resourceVersion", ""))

    async def _delete_object(self, path: str) -> None:
        await self._rest(f"delete {path}", "DELETE", path, {"kind": "DeleteOptions", "apiVersion": "v1"})

    async def get_resource_claim(self, namespace: str, name: str) -> Obj:
        path = resource_path("resourceclaims", namespace, name)
        return await self._rest(f"get {path}", "GET", path)  # type: ignore[no-any-return]

    async def list_resource_slices(self, field_selector: str = "") -> list[Obj]:
        items, _ = await self._list_objects(resource_path("resourceslices"), field_selector)
        return items

    async def create_resource_slice(self, body: Obj) -> Obj:
        return await self._rest("create ResourceSlice", "POST", resource_path("resourceslices"), body)  # type: ignore[no-any-return]

    async def replace_resource_slice(self, name: str, body: Obj) -> Obj:
        return await self._rest(f"replace ResourceSlice {name}", "PUT",  # type: ignore[no-any-return]
                                resource_path("resourceslices", name=name), body)

    async def delete_resource_slice(self, name: str) -> None:
        await self._delete_object(resource_path("resourceslices", name=name))

    async def create_device_taint_rule(self, body: Obj) -> Obj:
        return await self._rest("create DeviceTaintRule", "POST",  # type: ignore[no-any-return]
                                resource_path("devicetaintrules", api=TAINT_API), body)

    async def delete_device_taint_rule(self, name: str) -> None:
        await self._delete_object(resource_path("devicetaintrules", name=name, api=TAINT_API))

    # --- watch ------------------------------------------------------------------

    async def watch_pods(
        self,
        stop: asyncio.Event,
        namespace: str | None = None,
        field_selector: str = "",
        label_selector: str = "",
        resource_version: str = "",
    ) -> AsyncIterator[PodChange]:
        """List then watch until ``stop`` (or resume from ``resource_version``); see the module doc."""
        async def listing() -> tuple[list[Obj], str]:
            return await self.list_pods(namespace, field_selector, label_selector)

        async for change in self._watch(stop, "pods", _pods_path(namespace), listing, field_selector,
                                        label_selector, resource_version):  # fmt: skip
            yield change

    async def watch_resources(self, stop: asyncio.Event, plural: str, field_selector: str = ""
                              ) -> AsyncIterator[PodChange]:
        """Every object of one ``resource.k8s.io`` kind (``resourceclaims``, ``resourceslices``), of
        every namespace, as :meth:`watch_pods` gives pods."""
        path = resource_path(plural)

        async def listing() -> tuple[list[Obj], str]:
            return await self._list_objects(path, field_selector)

        async for change in self._watch(stop, plural, path, listing, field_selector):
            yield change

    async def _watch(self, stop: asyncio.Event, what: str, path: str,
                     listing: Callable[[], Awaitable[tuple[list[Obj], str]]], field_selector: str = "",
                     label_selector: str = "", resource_version: str = "") -> AsyncIterator[PodChange]:  # fmt: skip
        version = resource_version
        reader = ThreadPoolExecutor(1, thread_name_prefix=f"kube-watch-{what}")
        try:
            async for attempt in Supervised(f"watch {what}", stop, Backoff(0.2, 10.0), path=path,
                                            selector=field_selector or label_selector):  # fmt: skip
                try:
                    if not version:
                        items, version = await listing()
                        attempt.progress()
                        yield PodChange("SYNC", pods=items)
                    async with contextlib.aclosing(self._events(stop, reader, what, path, version, field_selector,
                                                                label_selector)) as events:  # fmt: skip
                        async for kind, obj in events:
                            attempt.progress()
                            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                            if kind in ("ADDED", "MODIFIED", "DELETED"):
                                yield PodChange(kind, pod=obj)
                    attempt.progress()  # the server ended it: watch again from the version
                except Gone:
                    log.info("watch expired, re-listing", what=what, path=path, selector=field_selector)
                    version = ""
                except KubeError as err:
                    attempt.failed(err)
        finally:
            reader.shutdown(wait=False)

    async def watch_pod_sets(
        self, stop: asyncio.Event, namespace: str | None = None, field_selector: str = "",
        label_selector: str = "",
    ) -> AsyncIterator[list[Obj]]:
        """The whole set of matching pods, yielded again after every change (list + watch)."""
        pods: dict[str, Obj] = {}
        async for change in self.watch_pods(stop, namespace, field_selector, label_selector):
            if change.kind == "SYNC":
                pods = {_obj_key(p): p for p in change.pods}
            elif change.pod is not None and change.kind == "DELETED":
                pods.pop(_obj_key(change.pod), None)
            elif change.pod is not None:
                pods[_obj_key(change.pod)] = change.pod
            yield list(pods.values())

    # --- nodes (list and watch) --------------------------------------------------

    async def list_nodes(self, label_selector: str = "") -> tuple[list[Obj], str]:
        doc = await self._rest("list nodes", "GET", "/api/v1/nodes", label_selector=label_selector)
        return list(doc.get("items") or []), str(doc["metadata"].get("resourceVersion", ""))

    async def watch_nodes(self, stop: asyncio.Event, label_selector: str = "") -> AsyncIterator[PodChange]:
        """The nodes as :meth:`watch_pods` gives pods: a ``SYNC`` (in ``pods``), then each change."""
        async def listing() -> tuple[list[Obj], str]:
            return await self.list_nodes(label_selector)

        async for change in self._watch(stop, "nodes", "/api/v1/nodes", listing, "", label_selector):
            yield change

    async def _events(self, stop: asyncio.Event, reader: ThreadPoolExecutor, what: str, path: str,
                      version: str, field_selector: str, label_selector: str) -> AsyncGenerator[tuple[str, Obj], None]:
        """One watch request from ``version``, with bookmarks: (type, object) until it ends or ``stop``."""
        what = f"watch {what}"
        events = self.client.watch(stop, reader, what, path, resource_version=version, allow_watch_bookmarks=True,
                                   timeout_seconds=self.settings.watch_timeout_s, field_selector=field_selector,
                                   label_selector=label_selector)
        async with contextlib.aclosing(events):
            async for event in events:
                yield _watch_event(event, what)


def _watch_event(event: Any, what: str) -> tuple[str, Obj]:
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        raise Retryable(f"{what}: an event that does not decode: {str(event)[:200]!r}")
    return str(event.get("type")), event["object"]


def _obj_key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
