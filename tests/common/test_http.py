"""The services' HTTP face: one FastAPI application per service, served by uvicorn for real."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from gpushare_common.http import Health, Model, ServiceStatus, bound_port, serve, service_app
from gpushare_common.settings import HttpSettings
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter

from tests.support.http import fetch


class Part(Model):
    count: int


class SampleStatus(ServiceStatus):
    """A sample service's view."""

    node: str
    """The node it serves."""
    parts: dict[str, Part]


@asynccontextmanager
async def served(status: Callable[[], Mapping[str, Any]] = lambda: {"node": "n1", "parts": {"a": {"count": 2}}},
                 routes: Callable[[FastAPI], None] | None = None) -> AsyncIterator[tuple[int, Health]]:
    health = Health("nats")
    registry = CollectorRegistry()
    Counter("gpushare_test_things", "things", registry=registry).inc()
    app = service_app("test", health, registry, status, SampleStatus)
    if routes is not None:
        routes(app)
    async with serve(app, HttpSettings(host="127.0.0.1", port=0)) as server:
        yield bound_port(server), health


async def test_endpoints_answer_as_the_health_says() -> None:
    async with served() as (port, health):
        assert (await fetch(port, "/healthz"))[0] == 200
        code, _, body = await fetch(port, "/readyz")
        assert code == 503 and json.loads(body)["components"]["nats"] == {"ready": False, "reason": ""}
        health.set("nats", True)
        assert (await fetch(port, "/readyz"))[0] == 200
        code, headers, body = await fetch(port, "/status")
        assert code == 200 and headers["content-type"] == "application/json"
        assert json.loads(body) == {"service": "test", "health": json.loads(body)["health"], "node": "n1",
                                    "parts": {"a": {"count": 2}}}
        assert json.loads(body)["health"]["ready"] is True
        code, headers, body = await fetch(port, "/metrics")
        assert code == 200 and b"gpushare_test_things_total 1.0" in body
        assert headers["content-type"] == CONTENT_TYPE_LATEST  # Prometheus text format
        health.alive = False
        code, _, body = await fetch(port, "/healthz")
        assert code == 503 and json.loads(body) == {"alive": False}


async def test_other_paths_and_methods_are_refused_and_head_has_no_body() -> None:
    async with served() as (port, _):
        assert (await fetch(port, "/nope"))[0] == 404
        code, headers, _ = await fetch(port, "/status", "POST")
        assert code == 405 and "GET" in headers["allow"]
        code, _, body = await fetch(port, "/status", "HEAD")
        assert code == 200 and body == b""


async def test_a_service_adds_its_own_routes_to_the_same_app() -> None:
    def routes(app: FastAPI) -> None:
        @app.get("/api/fleet")
        async def fleet() -> dict[str, int]:
            return {"nodes": 3}

    async with served(routes=routes) as (port, _):
        assert json.loads((await fetch(port, "/api/fleet"))[2]) == {"nodes": 3}
        assert (await fetch(port, "/healthz"))[0] == 200


async def test_a_failing_or_drifted_status_view_is_a_500_that_says_why() -> None:
    def broken() -> dict[str, Any]:
        raise KeyError("gone")

    async with served(broken) as (port, _):
        code, _, body = await fetch(port, "/status")
        assert code == 500 and "KeyError" in json.loads(body)["error"]
        assert (await fetch(port, "/healthz"))[0] == 200
    async with served(lambda: {"node": "n1", "parts": {}, "colour": "red"}) as (port, _):
        code, _, body = await fetch(port, "/status")  # a key the model does not declare
        assert code == 500 and "colour" in json.loads(body)["error"]
    async with served(lambda: {"node": "n1", "parts": {"a": {"count": "many"}}}) as (port, _):
        code, _, body = await fetch(port, "/status")  # a value of the wrong type
        assert code == 500 and "parts.a.count" in json.loads(body)["error"]


async def test_openapi_describes_the_status_with_its_fields_meanings() -> None:
    async with served() as (port, _):
        code, _, body = await fetch(port, "/openapi.json")
        assert code == 200
        document = json.loads(body)
        assert (await fetch(port, "/docs"))[0] == 200
    answer = document["paths"]["/status"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert answer == {"$ref": "#/components/schemas/SampleStatus"}
    schemas = document["components"]["schemas"]
    model = schemas["SampleStatus"]
    assert set(model["required"]) == {"service", "health", "node", "parts"}
    assert model["properties"]["node"]["description"] == "The node it serves."
    assert model["additionalProperties"] is False
    assert "components" in schemas["HealthReport"]["properties"]
    assert set(document["paths"]) >= {"/healthz", "/readyz", "/status", "/metrics"}
    assert "503" in document["paths"]["/readyz"]["get"]["responses"]
