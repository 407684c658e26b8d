"""The console against a stranger: its pages and API served for real (uvicorn), the Kubernetes API's
TokenReview stood in at the adapter boundary.

- With ``GPUSHARE_CONSOLE_AUTH=token`` nothing is shown without a bearer token the API
  authenticates (401), nor to a user outside ``GPUSHARE_CONSOLE_VIEWERS`` (403); a page's calls
  cost one review (the verdict is kept a while).
- Live update streams are bounded: with ``max_streams`` open, one more is refused at once (503),
  and a stream that ends frees its place. (2,000 unauthenticated streams were once accepted.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastapi import FastAPI
from gpushare_common.http import bound_port, serve
from gpushare_common.pods import PodRules
from gpushare_common.settings import HttpSettings
from gpushare_console.metrics import ConsoleMetrics
from gpushare_console.routes import add_routes
from gpushare_console.settings import ConsoleSettings
from gpushare_console.state import ClusterState
from prometheus_client import CollectorRegistry

USERS = {"alice-token": ("alice", ("gpu-admins",)), "bob-token": ("bob", ("devs",))}


class Reviews:
    """The API's answers by token (the adapter boundary), and how often it was asked."""

    def __init__(self) -> None:
        self.asked = 0

    async def __call__(self, token: str) -> dict[str, Any]:
        self.asked += 1
        found = USERS.get(token)
        if found is None:
            return {"authenticated": False, "error": "invalid bearer token"}
        return {"authenticated": True, "user": {"username": found[0], "groups": list(found[1])}}


@contextlib.asynccontextmanager
async def console(reviews: Reviews, **settings: Any) -> AsyncIterator[int]:
    stopping = asyncio.Event()
    app = FastAPI()
    add_routes(app, ClusterState(PodRules(), keep=10), ConsoleSettings(**settings),
               ConsoleMetrics(CollectorRegistry()), stopping, reviews)
    async with serve(app, HttpSettings(host="127.0.0.1", port=0)) as server:
        yield bound_port(server)
        stopping.set()


async def get(port: int, path: str, token: str = "") -> tuple[int, asyncio.StreamReader, asyncio.StreamWriter]:
    """Send a GET; the status code, and the open connection (a stream stays open)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: console\r\n{auth}\r\n".encode())
    await writer.drain()
    status = int((await asyncio.wait_for(reader.readline(), 5)).split()[1])
    return status, reader, writer


async def status_of(port: int, path: str, token: str = "") -> int:
    status, _, writer = await get(port, path, token)
    writer.close()
    return status


@pytest.mark.parametrize("path", ["/", "/api/fleet", "/api/evictions", "/api/nodes/gpu-node-1", "/api/updates"])
async def test_nothing_is_shown_without_a_token_the_api_authenticates(path: str) -> None:
    reviews = Reviews()
    async with console(reviews, auth="token", viewers=("group:gpu-admins",)) as port:
        assert await status_of(port, path) == 401
        assert await status_of(port, path, "stolen-or-made-up") == 401
        assert await status_of(port, path, "bob-token") == 403  # authenticated, not a viewer
        assert await status_of(port, path, "alice-token") in (200, 404)  # 404: no such node yet
    assert reviews.asked == 3  # each token reviewed once: its verdict is kept


async def test_without_auth_the_console_is_open_to_whoever_reaches_it() -> None:
    async with console(Reviews()) as port:  # the chart keeps it in the cluster (ClusterIP, port-forward)
        assert await status_of(port, "/api/fleet") == 200


async def test_live_streams_are_bounded_and_the_excess_refused_at_once() -> None:
    async with console(Reviews(), max_streams=8) as port:
        held = [await get(port, "/api/updates") for _ in range(8)]
        assert [status for status, _, _ in held] == [200] * 8
        refused, reader, writer = await get(port, "/api/updates")
        assert refused == 503 and b"retry-after: 5" in (await reader.read(4096)).lower()
        writer.close()
        held[0][2].close()  # one stream ends: its place is free again
        for _ in range(100):
            status, _, extra = await get(port, "/api/updates")
            extra.close()
            if status == 200:
                break
            await asyncio.sleep(0.05)
        assert status == 200
        for _, _, writer in held[1:]:
            writer.close()
