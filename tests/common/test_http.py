"""The services' HTTP face: four read-only endpoints without a web framework, served for real."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

from gpushare_common.http import Health, build_app, serve
from gpushare_common.settings import HttpSettings
from prometheus_client import CollectorRegistry, Counter


async def call(app: Any, path: str, method: str = "GET") -> tuple[int, dict[bytes, bytes], bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "path": path, "method": method, "headers": []}, receive, send)
    return sent[0]["status"], dict(sent[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def service_app(status: Any = lambda: {"node": "n1"}, extra: Any = None) -> tuple[Any, Health]:
    health = Health("nats")
    registry = CollectorRegistry()
    Counter("gpushare_test_things", "things", registry=registry).inc()
    return build_app("test", health, registry, status, extra), health


async def test_endpoints_answer_as_the_health_says() -> None:
    app, health = service_app()
    assert (await call(app, "/healthz"))[0] == 200
    code, _, body = await call(app, "/readyz")
    assert code == 503 and json.loads(body)["components"]["nats"]["ready"] is False
    health.set("nats", True)
    assert (await call(app, "/readyz"))[0] == 200
    code, headers, body = await call(app, "/status")
    assert code == 200 and headers[b"content-type"] == b"application/json"
    assert json.loads(body)["service"] == "test" and json.loads(body)["node"] == "n1"
    code, headers, body = await call(app, "/metrics")
    assert code == 200 and b"gpushare_test_things_total 1.0" in body
    assert headers[b"content-type"].startswith(b"text/plain")
    health.alive = False
    assert (await call(app, "/healthz"))[0] == 503


async def test_other_paths_and_methods_are_refused_or_passed_on() -> None:
    app, _ = service_app()
    assert (await call(app, "/nope"))[0] == 404
    code, headers, _ = await call(app, "/status", "POST")
    assert code == 405 and headers[b"allow"] == b"GET"
    code, _, body = await call(app, "/status", "HEAD")
    assert code == 200 and body == b""
    seen: list[str] = []

    async def extra(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    app, _ = service_app(extra=extra)
    assert (await call(app, "/api/fleet"))[0] == 204 and seen == ["/api/fleet"]
    assert (await call(app, "/healthz"))[0] == 200 and seen == ["/api/fleet"]


async def test_a_failing_status_view_is_a_500_not_a_dead_endpoint() -> None:
    def broken() -> dict[str, Any]:
        raise KeyError("gone")

    app, _ = service_app(broken)
    code, _, body = await call(app, "/status")
    assert code == 500 and "KeyError" in json.loads(body)["error"]
    assert (await call(app, "/healthz"))[0] == 200


async def test_served_over_real_http() -> None:
    app, _ = service_app()
    async with serve(app, HttpSettings(host="127.0.0.1", port=0)) as server:
        port = server.servers[0].sockets[0].getsockname()[1]

        def get(path: str) -> tuple[int, bytes]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                    return response.status, response.read()
            except urllib.error.HTTPError as err:
                return err.code, err.read()

        assert (await asyncio.to_thread(get, "/status"))[0] == 200
        assert (await asyncio.to_thread(get, "/readyz"))[0] == 503
        assert (await asyncio.to_thread(get, "/missing"))[0] == 404
