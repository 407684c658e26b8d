"""Request handlers: one function per verb, each returning a Starlette response."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from . import objects, params
from .errors import ApiError, bad_request, not_found, success
from .kinds import PODS, Kind
from .objects import Target
from .patch import APPLY_PATCH, JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH
from .routes import Route
from .store import Entry, Obj, Selection, Store
from .watch import WatchOptions, error_line, stream_events

_encode = msgspec.json.Encoder().encode
JSON = "application/json"
_PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH)


@dataclass(frozen=True, slots=True)
class Context:
    store: Store
    bookmark_interval: float


def json_response(body: Any, code: int = 200, warnings: list[str] | None = None) -> Response:
    raw = body if isinstance(body, bytes) else _encode(body)
    headers = {"Warning": ", ".join(f'299 - "{w}"' for w in warnings)} if warnings else None
    return Response(raw, status_code=code, media_type=JSON, headers=headers)


def error_response(error: ApiError) -> Response:
    return json_response(error.status(), error.code)


def _target(route: Route) -> Target:
    assert route.name is not None
    return Target(route.kind, route.namespace or "", route.name)


def _validator(route: Route, query: Any, warnings: list[str]) -> Callable[[Obj], None]:
    def validate(obj: Obj) -> None:
        warnings.extend(params.check_object(route.kind, obj, query))
        params.check_type(route.kind, obj)

    return validate


async def list_or_watch(ctx: Context, route: Route, request: Request) -> Response:
    query = request.query_params
    selection = params.selection(route.kind, route.namespace, query)
    timeout = params.integer(query, "timeoutSeconds")
    since = params.resource_version(query)
    if params.flag(query, "watch"):
        return _watch(ctx, selection, query, since, timeout)
    limit = params.integer(query, "limit") or 0
    entries = list(ctx.store.select(selection))
    meta: dict[str, Any] = {"resourceVersion": str(ctx.store.rv)}
    if limit > 0 or query.get("continue"):
        entries = _page(entries, limit, query.get("continue", ""), meta)
    return json_response(_list_body(route.kind, meta, [entry.raw for entry in entries]))


def _list_body(kind: Kind, meta: dict[str, Any], items: list[bytes]) -> bytes:
    """A <Kind>List from already encoded items (no decoding, no re-encoding)."""
    head = _encode({"kind": kind.list_kind, "apiVersion": kind.api_version, "metadata": meta})
    return head[:-1] + b',"items":[' + b",".join(items) + b"]}"


def _page(entries: list[Entry], limit: int, token: str, meta: dict[str, Any]) -> list[Entry]:
    def key(entry: Entry) -> tuple[str, str]:
        m = entry.obj["metadata"]
        return (m.get("namespace", ""), m["name"])

    entries.sort(key=key)
    if token:
        start = _decode_continue(token)
        entries = [e for e in entries if key(e) > start]
    if 0 < limit < len(entries):
        last = key(entries[limit - 1])
        meta["continue"] = base64.urlsafe_b64encode(_encode(list(last))).decode()
        meta["remainingItemCount"] = len(entries) - limit
        entries = entries[:limit]
    return entries


def _decode_continue(token: str) -> tuple[str, str]:
    try:
        start = msgspec.json.decode(base64.urlsafe_b64decode(token.encode()))
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise bad_request(f"invalid continue token {token!r}") from None
    if not (isinstance(start, list) and len(start) == 2 and all(isinstance(s, str) for s in start)):
        raise bad_request(f"invalid continue token {token!r}")
    return (start[0], start[1])


def _watch(
    ctx: Context, selection: Selection, query: Any, since: int | None, timeout: int | None
) -> Response:
    options = WatchOptions(
        timeout=float(timeout) if timeout else None,
        bookmarks=params.flag(query, "allowWatchBookmarks"),
        bookmark_interval=ctx.bookmark_interval,
    )
    try:
        watcher, first = ctx.store.watch(selection, since)
    except ApiError as error:
        return Response(error_line(error), media_type=JSON)
    return StreamingResponse(stream_events(ctx.store, watcher, first, options), media_type=JSON)


async def create(ctx: Context, route: Route, request: Request) -> Response:
    kind = route.kind
    if kind.namespaced and route.namespace is None:
        raise ApiError(405, f"create {kind.plural} under /namespaces/<namespace>/{kind.plural}")
    obj = params.decode_json(await request.body())
    warnings = params.check_object(kind, obj, request.query_params)
    params.check_type(kind, obj)
    params.check_identity(kind, obj, route.namespace or "", None)
    entry = objects.create(ctx.store, kind, route.namespace or "", obj)
    return json_response(entry.raw, 201, warnings)


async def get(ctx: Context, route: Route, request: Request) -> Response:
    target = _target(route)
    entry = ctx.store.get(target.kind, target.key)
    if entry is None:
        raise not_found(target.kind.plural, target.name, target.kind.group)
    return json_response(entry.raw)


async def replace(ctx: Context, route: Route, request: Request) -> Response:
    target = _target(route)
    obj = params.decode_json(await request.body())
    warnings = params.check_object(target.kind, obj, request.query_params)
    params.check_type(target.kind, obj)
    params.check_identity(target.kind, obj, target.namespace, target.name)
    status = route.subresource == "status"
    entry = objects.update(ctx.store, target, obj, status=status)
    return json_response(entry.raw, 200, warnings)


async def patch(ctx: Context, route: Route, request: Request) -> Response:
    target = _target(route)
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type not in _PATCH_TYPES:
        supported = ", ".join(_PATCH_TYPES)
        why = "server-side apply is not supported" if content_type == APPLY_PATCH else ""
        raise ApiError(415, f"unsupported patch type {content_type!r} {why}; use {supported}")
    body = params.decode_json(await request.body())
    if content_type != JSON_PATCH and not isinstance(body, dict):
        raise bad_request(f"a {content_type} body must be a JSON object")
    warnings: list[str] = []
    entry = objects.patch(
        ctx.store,
        target,
        content_type,
        body,
        status=route.subresource == "status",
        validate=_validator(route, request.query_params, warnings),
    )
    return json_response(entry.raw, 200, warnings)


def _deleted_status(kind: Kind, entry: Entry) -> dict[str, Any]:
    meta = entry.obj["metadata"]
    details = {"name": meta["name"], "group": kind.group, "kind": kind.plural, "uid": meta["uid"]}
    return success(200, details)


async def delete(ctx: Context, route: Route, request: Request) -> Response:
    target = _target(route)
    options = params.delete_options(request.query_params, await request.body())
    entry, _removed = objects.delete(ctx.store, target, options)
    if target.kind is PODS:
        return json_response(entry.raw)
    return json_response(_deleted_status(target.kind, entry))


async def delete_collection(ctx: Context, route: Route, request: Request) -> Response:
    query = request.query_params
    selection = params.selection(route.kind, route.namespace, query)
    options = params.delete_options(query, await request.body())
    deleted = []
    for entry in list(ctx.store.select(selection)):
        meta = entry.obj["metadata"]
        target = Target(route.kind, meta.get("namespace", ""), meta["name"])
        deleted.append(objects.delete(ctx.store, target, options)[0].raw)
    return json_response(_list_body(route.kind, {"resourceVersion": str(ctx.store.rv)}, deleted))


async def bind(ctx: Context, route: Route, request: Request) -> Response:
    target = _target(route)
    body = params.decode_json(await request.body())
    params.check_object(route.kind, body, request.query_params, model="V1Binding")
    node = (body.get("target") or {}).get("name")
    if not node:
        raise ApiError(422, "Binding is invalid: target.name: Required value")
    objects.bind(ctx.store, target, node)
    return json_response(success(201), 201)


async def evict(ctx: Context, route: Route, request: Request) -> Response:
    target = _target(route)
    body = params.decode_json(await request.body())
    params.check_object(route.kind, body, request.query_params, model="V1Eviction")
    options = body.get("deleteOptions") or {}
    objects.delete(ctx.store, target, params.delete_options({}, _encode(options)))
    return json_response(success(201), 201)
