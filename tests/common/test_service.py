"""The service skeleton: health wiring, HTTP, guarded tasks, and the order of the exit."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpushare_common.http import ServiceStatus
from gpushare_common.ports import port_of, ports_file, read_ports
from gpushare_common.retry import wait_any
from gpushare_common.service import ServiceBase, Skeleton
from gpushare_common.settings import HttpSettings, NatsSettings

from tests.support.http import fetch

LOOPBACK = HttpSettings(host="127.0.0.1", port=0)


async def test_serves_health_readiness_status_and_metrics() -> None:
    async with Skeleton("test", LOOPBACK, "state") as svc:
        port = await svc.serve(lambda: {"answer": 42})
        assert port == svc.port > 0
        assert (await fetch(port, "/healthz"))[0] == 200
        assert (await fetch(port, "/readyz"))[0] == 503
        svc.health.set("state", True)
        assert (await fetch(port, "/readyz"))[0] == 200
        code, _, body = await fetch(port, "/status")
        assert code == 200 and json.loads(body)["answer"] == 42 and json.loads(body)["service"] == "test"
        assert (await fetch(port, "/metrics"))[0] == 200


async def test_exit_cancels_the_tasks_then_closes_in_reverse_order() -> None:
    order: list[str] = []
    stop = asyncio.Event()
    svc = Skeleton("test", LOOPBACK, stop=stop)
    async with svc:
        bus = svc.bus(NatsSettings())  # never connected: draining it is harmless

        async def loop() -> None:
            try:
                await asyncio.Event().wait()
            finally:
                order.append(f"task cancelled, stopping={svc.stopping.is_set()}")

        async def closing() -> None:
            order.append("async resource")

        svc.on_exit(order.append, "first registered")
        svc.on_exit(closing)
        svc.spawn("loop", loop())
        stop.set()
        await svc.run_until_stopped()
    assert order == ["task cancelled, stopping=False", "async resource", "first registered"]
    assert svc.stopping.is_set() and svc.exit_code == 0 and not bus.connected.is_set()


async def test_a_crashed_critical_task_ends_the_run_with_exit_code_1() -> None:
    async with Skeleton("test", LOOPBACK) as svc:

        async def crash() -> None:
            raise RuntimeError("boom")

        svc.spawn("crasher", crash())
        await asyncio.wait_for(svc.run_until_stopped(), 5)
    assert svc.exit_code == 1 and not svc.stop.is_set()


async def test_the_nats_component_follows_the_bus_state() -> None:
    svc = Skeleton("test", LOOPBACK, "nats")
    bus = svc.bus(NatsSettings())
    for listener in bus.on_state:
        listener(True)
    assert svc.health.ready
    for listener in bus.on_state:
        listener(False)
    assert not svc.health.ready and svc.health.report()["components"]["nats"]["reason"] == "disconnected"
    await svc.close()
    await svc.close()  # twice is harmless


async def test_wait_any_returns_on_the_first_event_or_the_timeout() -> None:
    first, second = asyncio.Event(), asyncio.Event()
    assert not await wait_any(first, second, timeout=0.01)
    asyncio.get_running_loop().call_later(0.01, second.set)
    assert await asyncio.wait_for(wait_any(first, second), 5)


class SampleStatus(ServiceStatus):
    phase: str


class Sample(ServiceBase):
    """A service whose start waits for ``go`` (then fails when ``fail``)."""

    status_model = SampleStatus

    def __init__(self, fail: bool = False, stop: asyncio.Event | None = None) -> None:
        super().__init__("sample", LOOPBACK, "started", stop=stop)
        self.go, self.fail, self.phase = asyncio.Event(), fail, "new"
        self.skeleton.on_exit(lambda: setattr(self, "phase", "closed"))

    async def start(self) -> None:
        self.phase = "starting"
        await self.go.wait()
        if self.fail:
            raise RuntimeError("cannot start")
        self.health.set("started", True)
        self.phase = "started"

    def status(self) -> Mapping[str, Any]:
        return {"phase": self.phase}


async def test_run_serves_before_it_starts_then_runs_until_stopped() -> None:
    stop = asyncio.Event()
    service = Sample(stop=stop)
    running = asyncio.create_task(service.run())
    while not service.port:
        await asyncio.sleep(0.01)
    code, _, body = await fetch(service.port, "/status")
    assert code == 200 and json.loads(body)["phase"] == "starting"  # served while it starts
    assert (await fetch(service.port, "/readyz"))[0] == 503
    service.go.set()
    while not service.health.ready:
        await asyncio.sleep(0.01)
    assert not running.done()  # a start that ends is not a failure: the service runs on
    stop.set()
    assert await asyncio.wait_for(running, 5) == 0 and service.phase == "closed"


async def test_a_failed_start_ends_the_run_with_exit_code_1_and_a_stop_ends_a_start() -> None:
    service = Sample(fail=True)
    running = asyncio.create_task(service.run())
    service.go.set()
    assert await asyncio.wait_for(running, 5) == 1 and service.phase == "closed"
    stop = asyncio.Event()
    waiting = Sample(stop=stop)
    running = asyncio.create_task(waiting.run())
    while waiting.phase != "starting":
        await asyncio.sleep(0.01)
    stop.set()  # start never finished: cancelled on the way out
    assert await asyncio.wait_for(running, 5) == 0 and waiting.phase == "closed"


async def test_started_serves_and_starts_for_a_test_then_closes() -> None:
    service = Sample()
    service.go.set()
    async with service.started() as same:
        assert same is service and service.phase == "started" and service.health.ready
        assert json.loads((await fetch(service.port, "/status"))[2])["service"] == "sample"
    assert service.phase == "closed"


async def test_the_bound_port_is_reported_in_the_ports_file_until_exit(tmp_path: Path) -> None:
    async with Skeleton("test", replace(LOOPBACK, ports_dir=str(tmp_path))) as svc:
        port = await svc.serve(dict)
        assert read_ports(tmp_path, os.getpid()) == {"http": [f"http://127.0.0.1:{port}"]}
        assert port_of(read_ports(tmp_path, os.getpid())["http"][0]) == port  # type: ignore[index]
    assert read_ports(tmp_path, os.getpid()) is None and not ports_file(tmp_path, "test").exists()
