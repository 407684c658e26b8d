"""The suite's CPU report (tests/support/cputime.py) counts a test's own CPU and its reaped
processes', and lists the hungriest first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

BUSY = """
import subprocess, sys, time

def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass

def test_idle():
    time.sleep(0.3)

def test_busy_itself():
    burn(0.4)

def test_busy_in_a_child():
    code = "import time\\nend = time.process_time() + 0.6\\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", code], check=True)
"""


@pytest.fixture(autouse=True)
def _plugin_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))


def test_the_report_names_the_tests_by_their_cpu_children_included(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_busy=BUSY)
    result = pytester.runpytest_subprocess("-p", "tests.support.cputime", "--cpu-top", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    out = result.stdout.str()
    header = re.search(r"most CPU time \(3 tests, (\d+) s in all\)", out)
    assert header, out
    rows = re.findall(r"^\s*([\d.]+)s cpu  (\S+)$", out, re.MULTILINE)
    assert [name.rsplit("::", 1)[1] for _, name in rows] == ["test_busy_in_a_child", "test_busy_itself"], out
    child, itself = (float(seconds) for seconds, _ in rows)
    assert child >= 0.6 and itself >= 0.4


def test_no_report_when_asked_for_none(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_busy=BUSY)
    result = pytester.runpytest_subprocess("-p", "tests.support.cputime", "--cpu-top", "0", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    assert "most CPU time" not in result.stdout.str()
