"""The HTTP face of every service: ``/healthz``, ``/readyz``, ``/status``, ``/metrics``.

A small ASGI application served by uvicorn inside the service's own event loop (no web
framework: four read-only endpoints do not need one, and FastAPI with pydantic would be
about 15 MB of every service's memory). A service with pages of its own (the console) passes
them as ``extra``, any ASGI application, which gets every other path.
``/healthz`` is liveness (the process and its critical tasks are alive);
``/readyz`` is 200 only when every readiness component reported ready (e.g.
``nats`` connected, ``kernel`` registered); ``/status`` returns the JSON the
service's ``status()`` callable builds; ``/metrics`` is the service's own
Prometheus registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import uvicorn
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


ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]  # (scope, receive, send), any ASGI application


class ServiceApp:
    """``GET /healthz``, ``/readyz``, ``/status``, ``/metrics`` as an ASGI application; any other
    path goes to ``extra`` when there is one, else 404 (a known path with another method: 405)."""

    def __init__(self, service: str, health: Health, registry: CollectorRegistry,
                 status: Callable[[], dict[str, Any]], extra: ASGIApp | None = None) -> None:  # fmt: skip
        self.service, self.health, self.registry, self.status = service, health, registry, status
        self.extra = extra

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                       send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:  # fmt: skip
        if scope["type"] != "http" or scope["path"] not in _PATHS:
            if self.extra is not None:
                await self.extra(scope, receive, send)
            elif scope["type"] == "http":
                await _send(send, 404, _JSON, _dump({"detail": "Not Found"}))
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _send(send, 405, _JSON, _dump({"detail": "Method Not Allowed"}), allow=b"GET")
            return
        code, kind, body = self._answer(scope["path"])
        await _send(send, code, kind, b"" if scope["method"] == "HEAD" else body)

    def _answer(self, path: str) -> tuple[int, bytes, bytes]:
        health = self.health
        if path == "/healthz":
            return (200 if health.alive else 503), _JSON, _dump({"alive": health.alive})
        if path == "/readyz":
            return (200 if health.ready else 503), _JSON, _dump(health.report())
        if path == "/status":
            try:
                return 200, _JSON, _dump({"service": self.service, "health": health.report(), **self.status()})
            except Exception as err:  # a status view that fails must not take the endpoint down
                log.warning("status view failed", service=self.service, error=repr(err))
                return 500, _JSON, _dump({"service": self.service, "error": repr(err)})
        return 200, CONTENT_TYPE_LATEST.encode(), generate_latest(self.registry)


_PATHS = frozenset({"/healthz", "/readyz", "/status", "/metrics"})
_JSON = b"application/json"


def _dump(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), default=str).encode()


async def _send(send: Callable[[dict[str, Any]], Awaitable[None]], code: int, kind: bytes, body: bytes,
                allow: bytes = b"") -> None:  # fmt: skip
    headers = [(b"content-type", kind), (b"content-length", str(len(body)).encode())]
    if allow:
        headers.append((b"allow", allow))
    await send({"type": "http.response.start", "status": code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def build_app(service: str, health: Health, registry: CollectorRegistry, status: Callable[[], dict[str, Any]],
              extra: ASGIApp | None = None) -> ServiceApp:  # fmt: skip
    return ServiceApp(service, health, registry, status, extra)


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # the service runner owns signals
        pass


@contextlib.asynccontextmanager
async def serve(app: Any, settings: HttpSettings) -> AsyncIterator[_Server]:
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
        with contextlib.suppress(asyncio.CancelledError, Exception):  # stopping: the server ends as it can
            await asyncio.wait_for(task, timeout=5)


def bound_port(server: uvicorn.Server) -> int:
    for srv in getattr(server, "servers", []):
        for sock in srv.sockets:
            return int(sock.getsockname()[1])
    return 0
