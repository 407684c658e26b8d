"""The ASGI application: paths to handlers, every failure answered as a Status."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gpushare_common.logging import get_logger
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route as PathRoute

from . import authn, discovery, handlers, logs, namespaces, reads
from .context import Context, error_response, json_response
from .errors import ApiError
from .routes import Route, resolve
from .store import Store

log = get_logger("apiserver")
Handler = Callable[[Context, Route, Request], Awaitable[Response]]
_ALL = ["GET", "POST", "PUT", "PATCH", "DELETE"]

_COLLECTION: dict[str, Handler] = {
    "GET": reads.list_or_watch,
    "POST": handlers.create,
    "DELETE": handlers.delete_collection,
}
_ITEM: dict[str, Handler] = {
    "GET": reads.get,
    "PUT": handlers.replace,
    "PATCH": handlers.patch,
    "DELETE": handlers.delete,
}
_STATUS: dict[str, Handler] = {
    "GET": reads.get,
    "PUT": handlers.replace,
    "PATCH": handlers.patch,
}
_SUBRESOURCES: dict[str, dict[str, Handler]] = {
    "status": _STATUS,
    "binding": {"POST": handlers.bind},
    "eviction": {"POST": handlers.evict},
    "log": {"GET": logs.pod_log},
    "token": {"POST": handlers.request_token},
}
_COLLECTION_VERBS = {"GET": "list", "POST": "create", "DELETE": "deletecollection"}
_ITEM_VERBS = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


@dataclass(frozen=True, slots=True)
class ApiSettings:
    """What the served API keeps: history for watch resumption, watch queue bound."""

    history: int = 10_000
    watch_queue: int = 100_000
    bookmark_interval: float = 1.0  # often, so clients blocked in a read notice a close soon
    # resource requests must carry a service-account token this server issued and that still
    # holds (401 otherwise), as the API server's token authenticator wants; off: anyone may call
    authenticate: bool = False


def _handler(route: Route, method: str) -> Handler:
    verbs = _COLLECTION_VERBS if route.name is None else _ITEM_VERBS
    if route.subresource is None and verbs.get(method, method.lower()) not in route.kind.verbs:
        raise ApiError(405, f"{method} is not supported on {route.kind.resource}")
    if route.name is None:
        table = _COLLECTION
    elif route.subresource is None:
        table = _ITEM
    else:
        table = _SUBRESOURCES[route.subresource]
    handler = table.get(method)
    if handler is None:
        raise ApiError(405, f"{method} is not supported on this path")
    return handler


class Api:
    def __init__(self, store: Store, settings: ApiSettings) -> None:
        self.ctx = Context(store, settings.bookmark_interval)
        self.authenticate = settings.authenticate

    async def core(self, request: Request) -> Response:
        return await self._resources(request, "", "v1", request.path_params["rest"])

    async def grouped(self, request: Request) -> Response:
        group, version = request.path_params["group"], request.path_params["version"]
        return await self._resources(request, group, version, request.path_params["rest"])

    async def _resources(self, request: Request, group: str, version: str, rest: str) -> Response:
        try:
            if self.authenticate:
                authn.authenticate(self.ctx.store, request.headers.get("authorization", ""))
            if rest and not rest.startswith("/"):
                raise ApiError(404, f"the server could not find the requested path {request.url.path}")
            parts = [part for part in rest.split("/") if part]
            if not parts and request.method == "GET":
                found = discovery.resource_list(group, version)
                if found is None:
                    raise ApiError(404, f"group version {group}/{version} is not served")
                return json_response(found)
            route = resolve(group, version, parts)
            return await _handler(route, request.method)(self.ctx, route, request)
        except ApiError as error:
            return error_response(error)
        except RecursionError:
            return error_response(ApiError(400, "the request is nested too deeply"))
        except Exception as error:  # a bug: answer as a Status, log with the request
            log.exception("internal error", method=request.method, path=request.url.path)
            return error_response(ApiError(500, f"internal error: {error!r}"))

    async def group(self, request: Request) -> Response:
        found = discovery.group(request.path_params["group"])
        if found is None:
            return error_response(ApiError(404, "the server could not find the requested group"))
        return json_response(found)


async def _not_found(request: Request) -> Response:
    return error_response(ApiError(404, f"the server could not find the requested path {request.url.path}"))


async def _ok(request: Request) -> Response:
    return PlainTextResponse("ok")


def build_app(store: Store, settings: ApiSettings, address: Callable[[], str]) -> Starlette:
    """The ASGI app; `address` tells /api which host:port clients reach it at. The store gets
    the namespaces a fresh cluster has."""
    namespaces.bootstrap(store)
    api = Api(store, settings)

    async def core_versions(request: Request) -> Response:
        return json_response(discovery.core_versions(address()))

    async def groups(request: Request) -> Response:
        return json_response(discovery.group_list())

    async def version(request: Request) -> Response:
        return json_response(discovery.VERSION_INFO)

    async def openapi_index(request: Request) -> Response:
        return json_response(discovery.openapi_index())

    async def openapi_document(request: Request) -> Response:
        found = discovery.openapi_document(request.path_params["path"].strip("/"))
        if found is None:
            return error_response(ApiError(404, "no OpenAPI document for that group version"))
        return json_response(found)

    async def status(request: Request) -> Response:
        return json_response(store.status())

    routes = [
        PathRoute("/healthz", _ok),
        PathRoute("/readyz", _ok),
        PathRoute("/livez", _ok),
        PathRoute("/status", status),
        PathRoute("/openapi/v3", openapi_index),
        PathRoute("/openapi/v3/{path:path}", openapi_document),
        PathRoute("/version", version),
        PathRoute("/version/", version),
        PathRoute("/api", core_versions),
        PathRoute("/api/", core_versions),
        PathRoute("/apis", groups),
        PathRoute("/apis/", groups),
        PathRoute("/api/v1{rest:path}", api.core, methods=_ALL),
        PathRoute("/apis/{group}/{version}{rest:path}", api.grouped, methods=_ALL),
        PathRoute("/apis/{group}", api.group),
        PathRoute("/apis/{group}/", api.group),
        PathRoute("/{rest:path}", _not_found, methods=_ALL),
    ]
    return Starlette(routes=routes)
