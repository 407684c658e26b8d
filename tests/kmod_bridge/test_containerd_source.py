"""Containers from a real (private) containerd: task pid, CRI identity, their pid namespace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gpushare_common.adapters.containerd import ContainerdUnavailable
from gpushare_kmod_bridge.adapters.containerd import ContainerdSource
from gpushare_kmod_bridge.adapters.procfs import host_pidns, pidns_of
from gpushare_kmod_bridge.resolver import Resolver
from gpushare_sim.containerd import Containerd, missing_binaries

from tests.runtime.conftest import make_rootfs

pytestmark = pytest.mark.containerd

IDENTITY = {"io.kubernetes.cri.sandbox-namespace": "team-c", "io.kubernetes.cri.sandbox-name": "dev-2",
            "io.kubernetes.cri.container-name": "main"}
KUBELET_LABELS = {"io.kubernetes.pod.namespace": "team-d", "io.kubernetes.pod.name": "infer-1",
                  "io.kubernetes.container.name": "server"}


@pytest.fixture
def containerd() -> Iterator[Containerd]:
    missing = missing_binaries()
    if missing:
        pytest.skip(f"containerd tests need {', '.join(missing)} on PATH")
    with Containerd() as instance:
        yield instance


def remove(containerd: Containerd, container_id: str, namespace: str = "default") -> None:
    containerd.ctr("task", "kill", "-s", "SIGKILL", container_id, namespace=namespace)
    containerd.ctr("task", "delete", "-f", container_id, namespace=namespace)
    containerd.ctr("containers", "delete", container_id, namespace=namespace)


async def test_running_task_resolves_to_its_pod(containerd: Containerd, tmp_path: Path) -> None:
    rootfs = make_rootfs(tmp_path / "rootfs")
    containerd.run(rootfs, "owner-1", "/bin/sleep", "120", annotations=IDENTITY, detach=True)
    source = ContainerdSource(str(containerd.address), ("default",))
    try:
        (found,) = await source.containers()
        assert (found.container_id, found.pod, found.container) == ("owner-1", "team-c/dev-2", "main")
        resolver = Resolver([source], pidns_of, host_pidns())
        (pidns,) = (await resolver.namespaces(["team-c/dev-2/main"]))["team-c/dev-2/main"]
        assert pidns == pidns_of(found.pids[0]) and pidns != host_pidns()
        containerd.ctr("task", "kill", "-s", "SIGKILL", "owner-1")
        containerd.ctr("task", "delete", "-f", "owner-1")
        await resolver.refresh()
        assert resolver.snapshot.owners == {}  # a stopped container leaves the map
    finally:
        await source.close()


async def test_every_namespace_is_listed_with_labels_or_annotations(containerd: Containerd,
                                                                    tmp_path: Path) -> None:
    rootfs = make_rootfs(tmp_path / "rootfs")
    containerd.run(rootfs, "cri-1", "/bin/sleep", "120", annotations=IDENTITY, detach=True, namespace="k8s.io")
    containerd.run(rootfs, "kubelet-1", "/bin/sleep", "120", labels=KUBELET_LABELS, detach=True)
    containerd.run(rootfs, "plain-1", "/bin/sleep", "120", detach=True)
    containerd.run(rootfs, "done-1", "/bin/true")  # its task is stopped: nothing to resolve
    source = ContainerdSource(str(containerd.address), ("k8s.io", "default"))
    try:
        found = {c.container_id: c for c in await source.containers()}
        assert set(found) == {"cri-1", "kubelet-1", "plain-1"}
        assert (found["cri-1"].pod, found["cri-1"].container) == ("team-c/dev-2", "main")
        assert (found["kubelet-1"].pod, found["kubelet-1"].container) == ("team-d/infer-1", "server")
        assert (found["plain-1"].pod, found["plain-1"].container) == ("", "")
        for container_id, namespace in (("cri-1", "k8s.io"), ("kubelet-1", "default")):
            assert found[container_id].pids == (await source.client.pid(container_id, namespace),)
    finally:
        await source.close()


async def test_a_container_id_used_again_gets_its_new_identity(containerd: Containerd, tmp_path: Path) -> None:
    """Identities are kept per container id while its task lives, not after."""
    rootfs = make_rootfs(tmp_path / "rootfs")
    source = ContainerdSource(str(containerd.address), ("default",))
    try:
        containerd.run(rootfs, "reused", "/bin/sleep", "120", annotations=IDENTITY, detach=True)
        assert [c.pod for c in await source.containers()] == ["team-c/dev-2"]
        remove(containerd, "reused")
        assert await source.containers() == []
        containerd.run(rootfs, "reused", "/bin/sleep", "120", labels=KUBELET_LABELS, detach=True)
        assert [(c.pod, c.container) for c in await source.containers()] == [("team-d/infer-1", "server")]
    finally:
        await source.close()


async def test_unreachable_containerd_is_a_clear_error(tmp_path: Path) -> None:
    source = ContainerdSource(str(tmp_path / "absent.sock"), ("default",), timeout_s=5)
    try:
        with pytest.raises(ContainerdUnavailable, match=r"absent\.sock"):
            await source.containers()
    finally:
        await source.close()
