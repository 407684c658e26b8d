"""Shared fixtures: a real nats-server per test session, unique subject prefixes, leak checks."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from gpushare_common.settings import NatsSettings
from hypothesis import settings

from tests.support import lifeline, procs
from tests.support.nats import NatsServer, nats_binary, unique_prefix

lifeline.install()  # every process a test starts dies with the test runner

# property tests check what a parser or a rule does, never how fast: on a busy machine an example
# may take longer than Hypothesis's default 200 ms deadline, which would fail the test by chance
settings.register_profile("gpushare", deadline=None)
settings.load_profile("gpushare")


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    if nats_binary() is None:
        pytest.fail("nats-server is not installed: run `make deps` (apt package nats-server)")
    server = NatsServer().start()
    yield server
    server.cleanup()


@pytest.fixture
def subject_prefix(request: pytest.FixtureRequest) -> str:
    return unique_prefix(request.node.name)


@pytest.fixture
def nats_settings(nats_server: NatsServer, subject_prefix: str) -> NatsSettings:
    """Settings with this test's own prefix, stream and buckets on the session server."""
    return NatsSettings(
        url=nats_server.url,
        prefix=f"{subject_prefix}.v1",
        stream=subject_prefix.upper(),
        kv_prefix=subject_prefix,
        stream_max_bytes=64 << 20,
        reconnect_wait_s=0.1,
        ensure_layout=True,
    )


@pytest.fixture(autouse=True)
def no_leaked_processes() -> Iterator[None]:
    before = procs.children()
    yield
    deadline = time.monotonic() + 3
    while (left := procs.leaked(before)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if left:
        details = {pid: _cmdline(pid) for pid in left}
        for pid in left:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        pytest.fail(f"test left processes running: {details}")


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


from tests.support.kubeapi import kube_api  # noqa: E402,F401  (fixture shared by every test folder)
from tests.support.kubelet import kubelet  # noqa: E402,F401  (fixture shared by every test folder)
