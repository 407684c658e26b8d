"""The Kubernetes adapter: the only place that talks to the Kubernetes API.

Raw REST over a small HTTP/1.1 client on asyncio streams (:mod:`.http1`: the official
``kubernetes`` package, or an HTTP library, would cost each service 15-20 MB of resident
memory, and the client a thread per call). Objects are plain dicts in the API's JSON shape,
decoded with msgspec. Where the API is and
how to authenticate comes from :mod:`.kubeconfig`. Errors are this module's own tree:
:class:`NotFound`, :class:`Conflict`, :class:`Gone`, :class:`Invalid`, :class:`Retryable`
(5xx, 429, 401/403, timeouts, connection errors); no transport exception escapes.

:meth:`Kube.watch_pods` lists, then watches from the list's resourceVersion,
resumes from the last version seen, re-lists on ``410 Gone`` and backs off on
errors, yielding :class:`PodChange` items (a ``SYNC`` with the full list after
each (re)list, then ``ADDED``/``MODIFIED``/``DELETED``).
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..logging import get_logger
from ..retry import Backoff, wait_for_stop
from ..settings import KubeSettings
from .http1 import Http1Client, HttpError
from .kubeconfig import Endpoint, KubeConfigError, load_endpoint

log = get_logger("kube")
Obj = dict[str, Any]
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


class KubeError(Exception):
    def __init__(self, message: str, status: int = 0) -> None:
        self.status = status
        super().__init__(message)


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class Gone(KubeError):
    pass


class Invalid(KubeError):
    pass


class Retryable(KubeError):
    pass


_BY_STATUS: dict[int, type[KubeError]] = {404: NotFound, 409: Conflict, 410: Gone, 422: Invalid, 400: Invalid}


def _status_error(status: int, body: bytes, what: str) -> KubeError:
    reason = _status_message(body)
    return _BY_STATUS.get(status, Retryable)(f"{what}: {status} {reason}".strip(), status)


def _status_message(body: Any) -> str:
    with contextlib.suppress(Exception):  # any body the server sent: the status code alone tells then
        return str(msgspec.json.decode(body).get("message", ""))
    return ""


@dataclass(slots=True)
class PodChange:
    kind: str  # SYNC | ADDED | MODIFIED | DELETED
    pod: Obj | None = None
    pods: list[Obj] = field(default_factory=list)


_QUERY_NAMES = {
    "watch": "watch", "resource_version": "resourceVersion", "timeout_seconds": "timeoutSeconds",
    "allow_watch_bookmarks": "allowWatchBookmarks", "field_selector": "fieldSelector",
    "label_selector": "labelSelector",
}


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


def _query(query: dict[str, Any]) -> list[tuple[str, str]]:
    return [(_QUERY_NAMES.get(k, k), str(v).lower() if isinstance(v, bool) else str(v))
            for k, v in query.items() if v not in ("", None)]


class Kube:
    """Raw REST calls to the API server over kept-alive connections; :meth:`close` when done."""

    def __init__(self, settings: KubeSettings, endpoint: Endpoint | None = None) -> None:
        """:class:`KubeConfigError` (a setting, not a call) when the configuration cannot be used."""
        self.settings = settings
        self.endpoint = endpoint or load_endpoint(settings.kubeconfig)
        try:
            self.http = Http1Client(self.endpoint.server, self.endpoint.ssl_context)
        except ValueError as err:
            raise KubeConfigError(self.endpoint.source or "endpoint", str(err)) from None

    def _headers(self, content_type: str = "") -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        try:
            auth = self.endpoint.authorization()
        except KubeConfigError as err:
            raise Retryable(str(err)) from None
        if auth:
            headers["Authorization"] = auth
        return headers

    async def close(self) -> None:
        await self.http.close()

    async def _rest(self, what: str, method: str, path: str, body: Any = None,
                    content_type: str = "application/json", **query: Any) -> Any:
        """One call; the decoded JSON answer (None when empty)."""
        data = msgspec.json.encode(body) if body is not None else None
        payload = await self._send(what, method, path, _query(query), data, content_type)
        try:
            return msgspec.json.decode(payload) if payload else None
        except msgspec.DecodeError as err:
            raise Retryable(f"{what}: the answer is not JSON: {err}") from None

    async def _send(self, what: str, method: str, path: str, query: list[tuple[str, str]],
                    data: bytes | None, content_type: str) -> bytes:
        """The HTTP exchange: the answer's body, or this module's error for its status."""
        headers = self._headers(content_type if data is not None else "")
        try:
            response = await self.http.request(method, _target(path, query), headers, data,
                                               self.settings.qps_timeout_s)
        except (OSError, TimeoutError, HttpError, asyncio.IncompleteReadError) as err:
            raise Retryable(f"{what}: {err!r}") from None
        if not 200 <= response.status < 300:
            raise _status_error(response.status, response.body, what)
        return response.body

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

    async def _watch(self, stop: asyncio.Event, what: str, path: str,
                     listing: Callable[[], Awaitable[tuple[list[Obj], str]]], field_selector: str = "",
                     label_selector: str = "", resource_version: str = "") -> AsyncIterator[PodChange]:  # fmt: skip
        backoff = Backoff(0.2, 10.0, jitter=0.0)
        version = resource_version
        while not stop.is_set():
            try:
                if not version:
                    items, version = await listing()
                    yield PodChange("SYNC", pods=items)
                changes = self._stream(stop, path, what, field_selector, label_selector, version)
                async for kind, obj in changes:
                    version = str(obj.get("metadata", {}).get("resourceVersion") or version)
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        yield PodChange(kind, pod=obj)
                backoff.reset()
            except Gone:
                log.info("watch expired, re-listing", what=what, path=path, selector=field_selector)
                version = ""
            except KubeError as err:
                delay = backoff.next()
                log.warning("watch failed, backing off", what=what, error=str(err), retry_in_s=delay)
                await wait_for_stop(stop, delay)

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

    async def _stream(
        self, stop: asyncio.Event, path: str, resource: str, field_selector: str, label_selector: str,
        version: str,
    ) -> AsyncIterator[tuple[str, Obj]]:
        query = _query({"watch": True, "resource_version": version, "allow_watch_bookmarks": True,
                        "timeout_seconds": self.settings.watch_timeout_s, "field_selector": field_selector,
                        "label_selector": label_selector})
        what = f"watch {resource}"
        async for line in self._lines(stop, what, path, query):
            try:
                event = _watch_event(line)
            except (msgspec.DecodeError, AttributeError, TypeError, ValueError) as err:
                raise Retryable(f"{what}: an event that does not decode: {err}") from None
            yield event

    async def _lines(self, stop: asyncio.Event, what: str, path: str,
                     query: list[tuple[str, str]]) -> AsyncIterator[bytes]:
        """The watch's newline-delimited JSON lines, until the server ends it or ``stop``."""
        stopper = asyncio.ensure_future(stop.wait())
        try:
            async with self.http.stream(_target(path, query), self._headers(),
                                        self.settings.qps_timeout_s) as (status, _, chunks):
                if not 200 <= status < 300:
                    raise _status_error(status, b"".join([c async for c in chunks]), what)
                pending = b""
                while True:
                    reading = asyncio.ensure_future(anext(chunks, b""))
                    await asyncio.wait([reading, stopper], timeout=self.settings.watch_timeout_s + 30,
                                       return_when=asyncio.FIRST_COMPLETED)
                    if not reading.done():
                        reading.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await reading
                        if stop.is_set():
                            return
                        raise TimeoutError("the watch went silent")
                    chunk = reading.result()
                    if not chunk:
                        break
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        if line.strip():
                            yield line
                if pending.strip():
                    yield pending
        except (OSError, TimeoutError, HttpError, asyncio.IncompleteReadError) as err:
            raise Retryable(f"{what}: {err!r}") from None
        finally:
            stopper.cancel()


def _target(path: str, query: list[tuple[str, str]]) -> str:
    return path + ("?" + urllib.parse.urlencode(query) if query else "")


def _watch_event(line: bytes) -> tuple[str, Obj]:
    event = msgspec.json.decode(line)
    if not isinstance(event, dict):
        raise ValueError(f"a watch event is an object, not {type(event).__name__}")
    if event.get("type") == "ERROR":
        status = event.get("object", {})
        code = int(status.get("code") or 0)
        raise (Gone if code == 410 else Retryable)(str(status.get("message", "")), code)
    return str(event.get("type")), event.get("object") or {}


def _obj_key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
