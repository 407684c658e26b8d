"""The CPU each test spent, so a slow suite shows where its cores went (a pytest plugin).

``--durations`` says which tests took long; on a machine with few cores most of that may be
waiting for another test's processes. This plugin measures, per test (setup, call and teardown
together), the CPU time of the test process and of the processes it started and reaped
(``RUSAGE_SELF`` and ``RUSAGE_CHILDREN``: a process's CPU reaches its parent's children count
when it is reaped, so the processes a test leaves running are counted by the test that reaps
them), and prints the tests that used the most and the run's total at the end, beside
``--durations``. With xdist each worker measures its own tests; the figures travel to the
controller in the reports' ``user_properties``.

``--cpu-top N`` sets how many are shown (``0``: none).
"""

from __future__ import annotations

import resource
from collections.abc import Generator
from typing import Any

import pytest

KEY = "cpu_s"
_STARTED = pytest.StashKey[float]()


def _cpu_now() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-top",
        type=int,
        default=20,
        metavar="N",
        help="show the N tests that used the most CPU time (their own and their processes'); 0: none",
    )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    item.stash[_STARTED] = _cpu_now()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if call.when == "teardown" and _STARTED in item.stash:
        report.user_properties.append((KEY, round(_cpu_now() - item.stash[_STARTED], 3)))
    return report


class CpuReport:
    def __init__(self, top: int) -> None:
        self.top = top
        self.spent: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for key, value in report.user_properties:
            if key == KEY and isinstance(value, int | float):
                self.spent[report.nodeid] = float(value)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.spent:
            return
        write = terminalreporter.write_line
        total = sum(self.spent.values())
        terminalreporter.write_sep("=", f"most CPU time ({len(self.spent)} tests, {total:.0f} s in all)")
        for nodeid, seconds in sorted(self.spent.items(), key=lambda kv: -kv[1])[: self.top]:
            write(f"{seconds:8.2f}s cpu  {nodeid}")


def pytest_configure(config: pytest.Config) -> None:
    top = config.getoption("cpu_top")
    if top > 0 and not hasattr(config, "workerinput"):  # the controller (or a run without xdist) prints
        config.pluginmanager.register(CpuReport(top), "gpushare-cpu-report")
