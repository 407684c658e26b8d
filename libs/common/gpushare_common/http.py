"""The HTTP face of every service: ``/healthz``, ``/readyz``, ``/status``, ``/metrics``.

:func:`service_app` builds one FastAPI application for a service, served by uvicorn inside
the service's own event loop (:func:`serve`). A service with pages of its own (the console)
adds its routes to the same application. ``/openapi.json`` and ``/docs`` describe every
endpoint, ``/status`` by the service's own response model.

- ``/healthz`` is liveness (the process and its critical tasks are alive);
- ``/readyz`` is 200 only when every readiness component reported ready (e.g. ``nats``
  connected, ``kernel`` registered), else 503 with each component's reason;
- ``/status`` is the service's view (``service``, ``health`` and the fields of its
  :class:`ServiceStatus` model); a view that fails, or that no longer matches its model, is a
  500 that says why, and the other endpoints keep answering;
- ``/metrics`` is the service's own Prometheus registry.

The response models are pydantic models, FastAPI's own: FastAPI builds the OpenAPI document
from them without glue, each ``/status`` answer is checked against its model (a key the
model does not declare is an error, so the shape the console, the sim and the tests read
cannot drift unnoticed), and pydantic is loaded with FastAPI anyway. (msgspec stays the
events' codec: those structs cross NATS; these only describe an HTTP answer.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, ConfigDict

from .logging import get_logger
from .ports import listen
from .settings import HttpSettings

log = get_logger("http")


class Health:
    """Liveness and per-component readiness."""

    def __init__(self, *components: str) -> None:
        self._ready: dict[str, bool] = dict.fromkeys(components, False)
        self._reasons: dict[str, str] = {}
        self.alive = True
        self.started = time.time()

    def set(self, component: str, ready: bool, reason: str = "") -> None:
        if self._ready.get(component) != ready:
            log.info("readiness changed", component=component, ready=ready, reason=reason or None)
        self._ready[component] = ready
        self._reasons[component] = reason

    @property
    def ready(self) -> bool:
        return self.alive and all(self._ready.values())

    def report(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "alive": self.alive,
            "uptime_s": round(time.time() - self.started, 1),
            "components": {
                name: {"ready": ok, "reason": self._reasons.get(name, "")}
                for name, ok in self._ready.items()
            },
        }


class Model(BaseModel):
    """A response model: every key declared (an undeclared one is an error), fields documented
    by the docstring under them."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class Liveness(Model):
    alive: bool
    """False once the process should be restarted."""


class Component(Model):
    ready: bool
    reason: str
    """Why it is not ready ("" when it is)."""


class HealthReport(Model):
    ready: bool
    """True when alive and every component is ready."""
    alive: bool
    uptime_s: float
    """Seconds since the service started."""
    components: dict[str, Component]
    """The service's readiness components by name."""


class ServiceStatus(Model):
    """The part of ``/status`` every service has; each service's model adds its own fields."""

    service: str
    """The service's name."""
    health: HealthReport


class OpenStatus(ServiceStatus):
    """A ``/status`` whose other fields are not described (for tools that are not services)."""

    model_config = ConfigDict(extra="allow")


class StatusError(Model):
    service: str
    error: str
    """What failed while the view was built or checked."""


StatusView = Callable[[], Mapping[str, Any]]


def checked_status(service: str, health: Health, status: StatusView, model: type[ServiceStatus]) -> ServiceStatus:
    """``/status`` as served: ``service``, ``health`` and ``status()``, checked against ``model``
    (pydantic's ``ValidationError`` names each field that does not match)."""
    return model.model_validate({"service": service, "health": health.report(), **status()})


def service_app(service: str, health: Health, registry: CollectorRegistry, status: StatusView,
                model: type[ServiceStatus] = OpenStatus) -> FastAPI:  # fmt: skip
    """The service's FastAPI application: the four endpoints, ``status()`` checked against
    ``model``; a service adds its own routes to it."""
    app = FastAPI(title=f"gpushare {service}", summary=(model.__doc__ or "").strip().split("\n")[0])

    async def healthz() -> JSONResponse:
        return JSONResponse({"alive": health.alive}, 200 if health.alive else 503)

    async def readyz() -> JSONResponse:
        return JSONResponse(health.report(), 200 if health.ready else 503)

    async def status_view() -> Response:
        try:
            view = checked_status(service, health, status, model)
        except Exception as err:  # a boundary: a failing or drifted view must not take the endpoint down
            log.warning("status view failed", service=service, error=repr(err))
            return JSONResponse({"service": service, "error": repr(err)}, 500)
        return Response(view.model_dump_json(exclude_unset=True), media_type="application/json")  # its own keys

    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    def route(path: str, endpoint: Callable[[], Awaitable[Response]], **described: Any) -> None:
        app.add_api_route(path, endpoint, methods=["GET"], **described)
        app.add_api_route(path, endpoint, methods=["HEAD"], include_in_schema=False)

    route("/healthz", healthz, response_model=Liveness, responses={503: {"model": Liveness}})
    route("/readyz", readyz, response_model=HealthReport,
          responses={503: {"model": HealthReport, "description": "Not ready: each component's reason"}})
    route("/status", status_view, response_model=model, responses={500: {"model": StatusError}})
    route("/metrics", metrics, response_class=Response,
          responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"}})
    return app


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # the service runner owns signals
        pass


@contextlib.asynccontextmanager
async def serve(app: Any, settings: HttpSettings) -> AsyncIterator[_Server]:
    """Serve ``app`` in this event loop until the context exits, on a socket bound here first
    (``settings.port`` 0: any free port, see :func:`bound_port`); :class:`~.ports.BindError`
    when the address cannot be bound."""
    sock = listen(settings.host, settings.port)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = _Server(config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]), name="http")
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if task.done():
        sock.close()
        await task
        raise RuntimeError(f"HTTP server on {settings.host}:{settings.port} ended while starting")
    log.info("http listening", host=settings.host, port=bound_port(server))
    try:
        yield server
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, Exception):  # stopping: the server ends as it can
            await asyncio.wait_for(task, timeout=5)
        sock.close()


def bound_port(server: uvicorn.Server) -> int:
    for srv in getattr(server, "servers", []):
        for sock in srv.sockets:
            return int(sock.getsockname()[1])
    return 0
