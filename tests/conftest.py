"""Shared fixtures: a real nats-server per test session, unique subject prefixes, leak checks;
and how the suite runs in parallel (``make test``: pytest-xdist, ``-n 4 --dist loadgroup``).

Parallel runs (tests/README.md): a module's tests run in one worker, one after another (its
module fixtures are set up once); modules that share something outside their own temporary
directories (a build in the repository, the VM image cache, one qemu at a time) are named in
:data:`SHARED_GROUPS` and run in one worker, one after another. Modules holding a ``slow`` or
``vm`` test are handed out first, so that the long ones start at once instead of last.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from gpushare_common.settings import NatsSettings
from hypothesis import settings

from tests.support import lifeline, procs
from tests.support.nats import NatsServer, nats_binary, unique_prefix

pytest_plugins = ["pytester", "tests.support.cputime"]  # cputime: the tests that used the most CPU

lifeline.install()  # every process a test starts dies with the test runner

# property tests check what a parser or a rule does, never how fast: on a busy machine an example
# may take longer than Hypothesis's default 200 ms deadline, which would fail the test by chance
settings.register_profile("gpushare", deadline=None)
settings.load_profile("gpushare")


# module -> the group it runs in with the others of that group, one after another
SHARED_GROUPS = {
    "tests/kmod/test_kmod_vm.py": "vm",  # make -C kmod, the VM image cache, qemu
    "tests/kmod/test_vm_harness.py": "vm",
    "tests/kmod_bridge/test_vm.py": "vm",
}
# modules of independent long tests (no module fixture): each test is a group of its own
SPREAD = {"tests/bench/test_benches_run.py", "tests/deploy/test_image_install.py", "tests/e2e/test_run_cli.py"}


def xdist_group(nodeid: str) -> str:
    """The group a test runs in: its module's shared group, else its module (or, in a module of
    :data:`SPREAD`, the test itself)."""
    module = nodeid.split("::", 1)[0]
    return nodeid if module in SPREAD else SHARED_GROUPS.get(module, module)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` by :func:`xdist_group` (xdist's own marker-based grouping rewrites test
    ids in a way pytest 9.2 no longer reads)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The groups holding a ``slow`` or ``vm`` test first (each worker collects in this order, and
    ``--no-loadscope-reorder`` keeps it)."""
    long = {xdist_group(i.nodeid) for i in items if i.get_closest_marker("slow") or i.get_closest_marker("vm")}
    items.sort(key=lambda item: xdist_group(item.nodeid) not in long)  # stable: the rest keeps its order


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
