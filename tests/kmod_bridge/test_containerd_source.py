"""Containers from a real (private) containerd: task pid, CRI identity, their pid namespace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gpushare_kmod_bridge.adapters.containerd import ContainerdSource, CtrError
from gpushare_kmod_bridge.adapters.procfs import host_pidns, pidns_of
from gpushare_kmod_bridge.resolver import Resolver
from gpushare_sim.containerd import Containerd, missing_binaries

from tests.runtime.conftest import make_rootfs

pytestmark = pytest.mark.containerd

IDENTITY = {"io.kubernetes.cri.sandbox-namespace": "team-c", "io.kubernetes.cri.sandbox-name": "dev-2",
            "io.kubernetes.cri.container-name": "main"}


@pytest.fixture
def containerd() -> Iterator[Containerd]:
    missing = missing_binaries()
    if missing:
        pytest.skip(f"containerd tests need {', '.join(missing)} on PATH")
    with Containerd() as instance:
        yield instance


async def test_running_task_resolves_to_its_pod(containerd: Containerd, tmp_path: Path) -> None:
    rootfs = make_rootfs(tmp_path / "rootfs")
    containerd.run(rootfs, "owner-1", "/bin/sleep", "120", annotations=IDENTITY, detach=True)
    source = ContainerdSource(str(containerd.address), ("default",))
    (found,) = await source.containers()
    assert (found.container_id, found.pod, found.container) == ("owner-1", "team-c/dev-2", "main")
    resolver = Resolver([source], pidns_of, host_pidns())
    (pidns,) = (await resolver.namespaces(["team-c/dev-2/main"]))["team-c/dev-2/main"]
    assert pidns == pidns_of(found.pids[0]) and pidns != host_pidns()
    containerd.ctr("task", "kill", "-s", "SIGKILL", "owner-1")
    containerd.ctr("task", "delete", "-f", "owner-1")
    await resolver.refresh()
    assert resolver.snapshot.owners == {}  # a stopped container leaves the map


async def test_unreachable_containerd_is_a_clear_error(tmp_path: Path) -> None:
    source = ContainerdSource(str(tmp_path / "absent.sock"), ("default",), timeout_s=5)
    with pytest.raises(CtrError, match=r"absent\.sock"):
        await source.containers()
