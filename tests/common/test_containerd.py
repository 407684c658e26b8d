"""The containerd client against a real (private) containerd: tasks, containers with their labels
and annotations, kill and wait, and its typed errors."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import grpc
import pytest
from gpushare_common.adapters import containerd as ctrd
from gpushare_common.adapters.containerd import (
    ContainerdClient,
    ContainerdError,
    ContainerdUnavailable,
    ContainerNotFound,
    TaskNotFound,
    spec_annotations,
)
from gpushare_sim.containerd import Containerd

from tests.runtime.conftest import containerd, rootfs  # noqa: F401  (fixtures)

CRI = {"io.kubernetes.cri.sandbox-namespace": "team-a", "io.kubernetes.cri.sandbox-name": "web-0",
       "io.kubernetes.cri.container-name": "app"}
LABELS = {"example.com/role": "owner", "example.com/tier": "gold"}


def start(ctr: Containerd, root: Path, container_id: str, namespace: str = "k8s.io",
          annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> None:
    ctr.run(root, container_id, "/bin/sleep", "120", annotations=annotations, labels=labels, detach=True,
            namespace=namespace)


@pytest.mark.containerd
async def test_tasks_and_containers_are_listed_per_namespace(containerd: Containerd,  # noqa: F811
                                                             rootfs: Path) -> None:  # noqa: F811
    start(containerd, rootfs, "web-app", annotations=CRI, labels=LABELS)
    start(containerd, rootfs, "web-side")
    start(containerd, rootfs, "elsewhere", namespace="default")
    async with ContainerdClient(str(containerd.address)) as client:
        tasks = {t.container_id: t for t in await client.tasks()}
        assert set(tasks) == {"web-app", "web-side"}
        assert all(t.status == "RUNNING" and t.pid > 0 for t in tasks.values())
        assert tasks["web-app"].pid != tasks["web-side"].pid
        assert await client.task("web-app") == tasks["web-app"]
        assert await client.pid("web-app") == tasks["web-app"].pid
        assert [t.container_id for t in await client.tasks(namespace="default")] == ["elsewhere"]

        containers = {c.id: c for c in await client.containers()}
        assert set(containers) == {"web-app", "web-side"}
        app = containers["web-app"]
        assert app.labels.items() >= LABELS.items()
        assert app.annotations.items() >= CRI.items()
        assert not set(CRI) & set(containers["web-side"].annotations)
        assert await client.container("web-app") == app
        assert [c.id for c in await client.containers('id=="web-side"', 'id=="nothing"')] == ["web-side"]
        assert [c.id for c in await client.containers('labels."example.com/role"==owner')] == ["web-app"]
        assert [c.id for c in await client.containers(namespace="default")] == ["elsewhere"]


@pytest.mark.containerd
async def test_kill_and_wait_report_the_exit(containerd: Containerd, rootfs: Path) -> None:  # noqa: F811
    start(containerd, rootfs, "victim")
    async with ContainerdClient(str(containerd.address)) as client:
        with pytest.raises(ContainerdUnavailable, match="wait task victim"):
            await client.wait("victim", timeout_s=0.2)  # still running: no answer in time
        await client.kill("victim", signal.SIGKILL)
        assert await client.wait("victim", timeout_s=10) == 128 + signal.SIGKILL
        task = await client.task("victim")
        assert (task.status, task.exit_status) == ("STOPPED", 128 + signal.SIGKILL)
        assert await client.pid("victim") == 0  # not running: no pid to signal


@pytest.mark.containerd
async def test_missing_tasks_and_containers_are_not_found(containerd: Containerd,  # noqa: F811
                                                          rootfs: Path) -> None:  # noqa: F811
    containerd.ctr("containers", "create", "--rootfs", str(rootfs),
                   "never-started", "/bin/true", namespace="k8s.io")  # a container without a task
    async with ContainerdClient(str(containerd.address)) as client:
        calls = (lambda: client.task("ghost"), lambda: client.pid("ghost"), lambda: client.kill("ghost"),
                 lambda: client.wait("ghost", 5), lambda: client.task("never-started"))
        for call in calls:
            with pytest.raises(TaskNotFound, match=r"task (ghost|never-started)"):
                await call()
        with pytest.raises(ContainerNotFound, match="get container ghost"):
            await client.container("ghost")
        assert (await client.container("never-started")).id == "never-started"
        with pytest.raises(ContainerdError) as caught:
            await client.containers("id==")  # a filter containerd cannot parse
        assert type(caught.value) is ContainerdError and "list containers" in str(caught.value)


@pytest.mark.containerd
async def test_a_stopped_containerd_is_unavailable(containerd: Containerd) -> None:  # noqa: F811
    async with ContainerdClient(str(containerd.address), call_timeout_s=2) as client:
        assert await client.tasks() == []
        containerd.stop()
        calls = (client.tasks, lambda: client.task("any"), client.containers, lambda: client.kill("any"))
        for call in calls:
            with pytest.raises(ContainerdUnavailable, match=re.escape(str(containerd.address))):
                await call()


async def test_a_missing_socket_is_unavailable(tmp_path: Path) -> None:
    async with ContainerdClient(str(tmp_path / "absent.sock"), call_timeout_s=2) as client:
        with pytest.raises(ContainerdUnavailable, match=r"list tasks: .*absent\.sock"):
            await client.tasks()
        with pytest.raises(ContainerdUnavailable, match=r"absent\.sock"):
            await client.container("any")


async def test_a_client_not_opened_is_unavailable(tmp_path: Path) -> None:
    client = ContainerdClient(str(tmp_path / "containerd.sock"))
    with pytest.raises(ContainerdUnavailable, match="not opened"):
        await client.tasks()
    async with client:
        assert client.is_open
    assert not client.is_open
    with pytest.raises(ContainerdUnavailable, match="not opened"):
        await client.container("any")


def test_a_deadline_is_unavailable_whichever_side_saw_it_first() -> None:
    """A Wait past its deadline ends either in the client (DEADLINE_EXCEEDED) or in containerd,
    which passes the deadline on to the shim and reports its lapse as UNKNOWN."""
    client = ContainerdClient("/run/test/containerd.sock")
    answers = [(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),
               (grpc.StatusCode.UNKNOWN, "context deadline exceeded: unknown"),
               (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")]
    for code, detail in answers:
        err = client._translate(grpc.aio.AioRpcError(code, details=detail), "wait task x", TaskNotFound)
        assert type(err) is ContainerdUnavailable and "/run/test/containerd.sock" in str(err), (code, err)
    other = client._translate(grpc.aio.AioRpcError(grpc.StatusCode.UNKNOWN, details="shim died"), "kill", TaskNotFound)
    assert type(other) is ContainerdError
    missing = client._translate(grpc.aio.AioRpcError(grpc.StatusCode.NOT_FOUND, details="no"), "get", TaskNotFound)
    assert type(missing) is TaskNotFound


def test_only_the_specs_annotations_are_read() -> None:
    spec = b'{"ociVersion": "1.1.0", "process": {"args": ["sh"]}, "annotations": {"a": "1", "b": "2"}}'
    assert spec_annotations(spec) == {"a": "1", "b": "2"}
    assert spec_annotations(b'{"ociVersion": "1.1.0"}') == {}
    assert spec_annotations(b'{"annotations": null}') == {}
    for unreadable in (b"", b"not json", b"[1, 2]", b'{"annotations": {"a": 1}}', b"\x0a\x03abc"):
        assert spec_annotations(unreadable) == {}, unreadable


def test_the_solver_port_names_the_same_errors() -> None:
    from gpushare_solver import ports

    assert (ports.ContainerdError, ports.TaskNotFound, ports.ContainerdUnavailable) == (
        ctrd.ContainerdError, ctrd.TaskNotFound, ctrd.ContainerdUnavailable)
    assert issubclass(ctrd.ContainerNotFound, ctrd.ContainerdError)
