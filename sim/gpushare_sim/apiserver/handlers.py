"""Write handlers: one function per verb, each returning a Starlette response."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from . import apply, authn, errors, namespaces, objects, params
from .context import Context, json_response
from .errors import ApiError, bad_request, success
from .kinds import NAMESPACES, Kind
from .objects import Target
from .patch import APPLY_PATCH, JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH
from .reads import list_body
from .routes import Route
from .store import Entry, Obj

_encode = msgspec.json.Encoder().encode
_PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH)


def _target(route: Route) -> Target:
    assert route.name is not None
    return Target(route.kind, route.namespace or "", route.name)


def _validator(route: Route, query: Any, warnings: list[str]) -> Callable[[Obj], None]:
    def validate(obj: Obj) -> None:
        warnings.extend(params.check_object(route.kind, obj, query))
        params.check_type(route.kind, obj)

    return validate


async def body_of(request: Request) -> Any:
    return params.decode_body(await request.body(), request.headers.get("content-type"))


async def create(ctx: Context, route: Route, request: Request) -> Response:
    kind = route.kind
    if kind.namespaced and route.namespace is None:
        raise ApiError(405, f"create {kind.plural} under /namespaces/<namespace>/{kind.plural}")
    obj = await body_of(request)
    warnings = params.check_object(kind, obj, request.query_params)
    params.check_type(kind, obj)
    if not kind.stored:
        return json_response(authn.review(ctx.store, obj), 201, warnings)
    params.check_identity(kind, obj, route.namespace or "", None)
    if kind.namespaced:
        name = (obj.get("metadata") or {}).get("name") or ""
        namespaces.require_active(ctx.store, kind, route.namespace or "", name)
    if kind is NAMESPACES:
        entry = namespaces.create(ctx.store, obj)
    else:
        entry = objects.create(ctx.store, kind, route.namespace or "", obj)
    return json_response(entry.raw, 201, warnings)


async def replace(ctx: Context, route: Route, request: Request) -> Response:
    target = _target(route)
    obj = await body_of(request)
    warnings = params.check_object(target.kind, obj, request.query_params)
    params.check_type(target.kind, obj)
    params.check_identity(target.kind, obj, target.namespace, target.name)
    status = route.subresource == "status"
    entry = objects.update(ctx.store, target, obj, status=status)
    return json_response(entry.raw, 200, warnings)


async def patch(ctx: Context, route: Route, request: Request) -> Response:
    target = _target(route)
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type == APPLY_PATCH:
        return await server_side_apply(ctx, route, request)
    if content_type not in _PATCH_TYPES:
        supported = ", ".join((*_PATCH_TYPES, APPLY_PATCH))
        raise ApiError(415, f"unsupported patch type {content_type!r}; use {supported}")
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
    options = params.delete_options(request.query_params, await request.body(), request.headers.get("content-type"))
    entry, removed = namespaces.delete(ctx.store, target, options)
    if target.kind.delete_returns_object or not removed:
        return json_response(entry.raw)
    return json_response(_deleted_status(target.kind, entry))


async def delete_collection(ctx: Context, route: Route, request: Request) -> Response:
    query = request.query_params
    selection = params.selection(route.kind, route.namespace, query)
    options = params.delete_options(query, await request.body(), request.headers.get("content-type"))
    deleted = []
    for entry in list(ctx.store.select(selection)):
        meta = entry.obj["metadata"]
        target = Target(route.kind, meta.get("namespace", ""), meta["name"])
        deleted.append(namespaces.delete(ctx.store, target, options)[0].raw)
    return json_response(list_body(route.kind, {"resourceVersion": str(ctx.store.rv)}, deleted))


async def bind(ctx: Context, route: Route, request: Request) -> Response:
    target = _target(route)
    body = await body_of(request)
    params.check_object(route.kind, body, request.query_params, model="V1Binding")
    node = (body.get("target") or {}).get("name")
    if not node:
        raise ApiError(422, "Binding is invalid: target.name: Required value")
    objects.bind(ctx.store, target, node)
    return json_response(success(201), 201)


async def evict(ctx: Context, route: Route, request: Request) -> Response:
    target = _target(route)
    body = await body_of(request)
    params.check_object(route.kind, body, request.query_params, model="V1Eviction")
    options = body.get("deleteOptions") or {}
    namespaces.delete(ctx.store, target, params.delete_options({}, _encode(options)))
    return json_response(success(201), 201)


async def request_token(ctx: Context, route: Route, request: Request) -> Response:
    """serviceaccounts/<name>/token: a TokenRequest answered with a signed token."""
    target = _target(route)
    body = await body_of(request)
    params.check_object(route.kind, body, request.query_params, model="AuthenticationV1TokenRequest")
    params.check_type(route.kind, body, expected_kind="TokenRequest")
    return json_response(authn.issue(ctx.store, target.namespace, target.name, body), 201)


async def server_side_apply(ctx: Context, route: Route, request: Request) -> Response:
    """PATCH with an apply configuration: create the object, or apply it for its field manager."""
    target, query = _target(route), request.query_params
    if route.subresource is not None:
        raise ApiError(415, f"server-side apply of the {route.subresource} subresource is not supported")
    manager = query.get("fieldManager", "")
    if not manager:
        raise errors.invalid("PatchOptions.meta.k8s.io", "", [("fieldManager", "Required value: is required "
                                                               "for apply patch")])  # fmt: skip
    force = params.flag(query, "force")
    config = params.decode_yaml(await request.body())
    warnings = params.check_object(target.kind, config, query)
    params.check_type(target.kind, config)
    params.check_identity(target.kind, config, target.namespace, target.name)
    entry = ctx.store.get(target.kind, target.key)
    if entry is not None:
        applied = apply.apply(entry.copy(), config, manager, force)
        return json_response(objects.update(ctx.store, target, applied).raw, 200, warnings)
    if target.kind.namespaced:
        namespaces.require_active(ctx.store, target.kind, target.namespace, target.name)
    fresh = apply.apply({}, config, manager, force)
    fresh.setdefault("metadata", {})["name"] = target.name
    create = namespaces.create if target.kind is NAMESPACES else None
    created = create(ctx.store, fresh) if create else objects.create(ctx.store, target.kind, target.namespace, fresh)
    return json_response(created.raw, 201, warnings)
