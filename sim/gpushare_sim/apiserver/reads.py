"""Read handlers: list, watch and get, as JSON or as server-side tables."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from . import params, tables
from .context import JSON, Context, json_response
from .errors import ApiError, bad_request, not_found
from .kind import Kind
from .routes import Route
from .store import Entry, Selection
from .watch import WatchOptions, error_line, stream_events

_encode = msgspec.json.Encoder().encode


async def list_or_watch(ctx: Context, route: Route, request: Request) -> Response:
    query = request.query_params
    selection = params.selection(route.kind, route.namespace, query)
    timeout = params.integer(query, "timeoutSeconds")
    since = params.resource_version(query)
    wanted = tables.negotiate(request.headers.get("accept"), query)
    if params.flag(query, "watch"):
        return _watch(ctx, selection, query, since, timeout, wanted)
    limit = params.integer(query, "limit") or 0
    entries = list(ctx.store.select(selection))
    meta: dict[str, Any] = {"resourceVersion": str(ctx.store.rv)}
    if limit > 0 or query.get("continue"):
        entries = _page(entries, limit, query.get("continue", ""), meta)
    if wanted is not None:
        body = tables.table(route.kind, [entry.obj for entry in entries], meta, wanted)
        return Response(body, media_type=wanted.media_type)
    return json_response(list_body(route.kind, meta, [entry.raw for entry in entries]))


def list_body(kind: Kind, meta: dict[str, Any], items: list[bytes]) -> bytes:
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
    ctx: Context,
    selection: Selection,
    query: Any,
    since: int | None,
    timeout: int | None,
    wanted: tables.TableRequest | None,
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
    stream = stream_events(ctx.store, watcher, first, options)
    if wanted is not None:
        return StreamingResponse(tables.watch_tables(selection.kind, stream, wanted), media_type=wanted.media_type)
    return StreamingResponse(stream, media_type=JSON)


async def get(ctx: Context, route: Route, request: Request) -> Response:
    assert route.name is not None
    kind = route.kind
    entry = ctx.store.get(kind, (route.namespace or "", route.name))
    if entry is None:
        raise not_found(kind.plural, route.name, kind.group)
    wanted = tables.negotiate(request.headers.get("accept"), request.query_params)
    if wanted is not None and route.subresource is None:
        meta = {"resourceVersion": entry.obj["metadata"]["resourceVersion"]}
        return Response(tables.table(kind, [entry.obj], meta, wanted), media_type=wanted.media_type)
    return json_response(entry.raw)
