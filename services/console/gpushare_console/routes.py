"""The console's pages and JSON API, added to the service's FastAPI application (:mod:`gpushare_common.http`).

``/`` is the one page (``static/index.html`` with plain JS and CSS); its views are
``#/`` (the fleet), ``#/node/<name>`` and ``#/evictions``. ``/api/fleet``,
``/api/nodes/<name>`` and ``/api/evictions`` are the JSON behind them; ``/api/updates`` is a
server-sent event stream that says ``version`` at once and after every change (bursts
coalesced over 50 ms; a comment every 15 s keeps proxies from closing it), on which the page
reloads what it shows. Handlers are coroutines: they read the state in the loop that changes it.
Every route but the static files asks :class:`~.guard.Viewers` (who may look), and the live
stream :class:`~.guard.Streams` (how many may follow at once).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles

from . import views
from .guard import Review, Streams, Viewers
from .metrics import ConsoleMetrics
from .settings import ConsoleSettings
from .state import ClusterState

STATIC = Path(__file__).parent / "static"
KEEPALIVE_S = 15.0
COALESCE_S = 0.05


async def updates(state: ClusterState, stopping: asyncio.Event, metrics: ConsoleMetrics) -> AsyncIterator[str]:
    metrics.clients.inc()
    try:
        seen = -1
        while not stopping.is_set():
            version = await state.changes.wait(seen, KEEPALIVE_S)
            if stopping.is_set():
                return
            if version == seen:
                yield ": keepalive\n\n"
                continue
            seen = version
            yield f"event: version\ndata: {json.dumps({'version': version})}\n\n"
            await asyncio.sleep(COALESCE_S)
    finally:
        metrics.clients.dec()


def add_routes(app: FastAPI, state: ClusterState, settings: ConsoleSettings, metrics: ConsoleMetrics,
               stopping: asyncio.Event, review: Review) -> None:  # fmt: skip
    app.mount("/static", StaticFiles(directory=STATIC), name="static")  # the page's code: no data
    viewers, streams = Viewers(settings, review), Streams(settings.max_streams)
    app.router.dependencies.append(Depends(viewers))

    @app.get("/", response_model=None)
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/api/fleet")
    async def fleet() -> JSONResponse:
        return JSONResponse(views.fleet(state, settings))

    @app.get("/api/nodes/{name}")
    async def node(name: str) -> JSONResponse:
        found = views.node(state, settings, name)
        if found is None:
            return JSONResponse({"error": f"no node {name!r}"}, status_code=404)
        return JSONResponse(found)

    @app.get("/api/evictions")
    async def evictions() -> JSONResponse:
        return JSONResponse(views.evictions(state))

    @app.get("/api/updates", response_model=None)
    async def live() -> StreamingResponse:
        streams.check()
        return StreamingResponse(streams.follow(updates(state, stopping, metrics)), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
