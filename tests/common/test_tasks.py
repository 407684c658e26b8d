"""Guarded tasks and the service entry point."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from gpushare_common.entry import service_main
from gpushare_common.ports import listen
from gpushare_common.service import Skeleton
from gpushare_common.settings import HttpSettings, SettingsError, topic
from gpushare_common.tasks import ServiceMain, Tasks, run_service, wait_first


async def test_a_crashing_critical_task_stops_the_service() -> None:
    stop = asyncio.Event()
    tasks = Tasks("test", stop)

    async def crash() -> None:
        raise RuntimeError("boom")

    tasks.spawn("crasher", crash())
    await asyncio.wait_for(wait_first(stop, tasks), 5)
    assert isinstance(tasks.failure, RuntimeError) and str(tasks.failure) == "boom"


async def test_tasks_ending_because_of_stop_are_not_failures() -> None:
    stop = asyncio.Event()
    tasks = Tasks("test", stop)
    tasks.spawn("waiter", stop.wait())
    stop.set()
    await asyncio.sleep(0)
    await tasks.cancel_all()
    assert tasks.failure is None and not tasks.failed.is_set()


@dataclass(frozen=True, slots=True)
class XSettings:
    port: int = 1


@dataclass(frozen=True, slots=True)
class Settings:
    x: XSettings = topic(XSettings, "GPUSHARE_X_")


def test_service_main_reports_a_bad_setting_and_exits_2(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def build(settings: Settings) -> ServiceMain:
        raise SettingsError("GPUSHARE_X_NODE", "", "a node")

    monkeypatch.setenv("GPUSHARE_X_PORT", "eighty")
    assert service_main("x", Settings, build, argv=[]) == 2
    assert capsys.readouterr().err.strip() == "gpushare-x: GPUSHARE_X_PORT='eighty': expected a number (int)"
    monkeypatch.delenv("GPUSHARE_X_PORT")
    assert service_main("x", Settings, build, argv=[]) == 2  # what build reads is a setting too
    assert capsys.readouterr().err.strip() == "gpushare-x: GPUSHARE_X_NODE='': expected a node"


def test_service_main_runs_the_service_until_it_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Settings] = []

    async def main(stop: asyncio.Event) -> int:
        return 0

    def build(settings: Settings) -> ServiceMain:
        seen.append(settings)
        return main

    monkeypatch.setenv("GPUSHARE_X_PORT", "7")
    assert service_main("x", Settings, build, argv=[]) == 0 and seen == [Settings(XSettings(7))]


def test_a_port_that_cannot_be_bound_ends_the_service_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    holder = listen("127.0.0.1", 0)
    port = holder.getsockname()[1]

    async def main(stop: asyncio.Event) -> int:
        async with Skeleton("x", HttpSettings(host="127.0.0.1", port=port)) as svc:
            await svc.serve(dict)
        return 0

    try:
        assert run_service("x", main) == 1
    finally:
        holder.close()
    err = capsys.readouterr().err
    assert err.startswith(f"gpushare-x: cannot listen on 127.0.0.1:{port}: Address already in use")
    assert err.count("\n") == 1 and "Traceback" not in err
