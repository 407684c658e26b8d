"""The HTTP face of every service: ``/healthz``, ``/readyz``, ``/status``, ``/metrics``.

Built with FastAPI and served by uvicorn inside the service's own event loop.
``/healthz`` is liveness (the process and its critical tasks are alive);
``/readyz`` is 200 only when every readiness component reported ready (e.g.
``nats`` connected, ``kernel`` registered); ``/status`` returns the JSON the
service's ``status()`` callable builds; ``/metrics`` is the service's own
Prometheus registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .logging import get_logger
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


def build_app(
    service: str,
    health: Health,
    registry: CollectorRegistry,
    status: Callable[[], dict[str, Any]],
) -> FastAPI:
    app = FastAPI(title=f"gpushare {service}", docs_url=None, redoc_url=None)

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        return JSONResponse({"alive": health.alive}, status_code=200 if health.alive else 503)

    @app.get("/readyz")
    def readyz() -> JSONResponse:
        return JSONResponse(health.report(), status_code=200 if health.ready else 503)

    @app.get("/status")
    def status_view() -> JSONResponse:
        return JSONResponse({"service": service, "health": health.report(), **status()})

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # the service runner owns signals
        pass


@contextlib.asynccontextmanager
async def serve(app: FastAPI, settings: HttpSettings) -> AsyncIterator[_Server]:
    """Serve ``app`` in this event loop until the context exits."""
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level="warning",
        access_log=False, lifespan="off",
    )
    server = _Server(config)
    task = asyncio.get_running_loop().create_task(server.serve(), name="http")
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if task.done():
        await task
        raise RuntimeError(f"HTTP server could not listen on {settings.host}:{settings.port}")
    log.info("http listening", host=settings.host, port=bound_port(server))
    try:
        yield server
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(task, timeout=5)


def bound_port(server: uvicorn.Server) -> int:
    for srv in getattr(server, "servers", []):
        for sock in srv.sockets:
            return int(sock.getsockname()[1])
    return 0
