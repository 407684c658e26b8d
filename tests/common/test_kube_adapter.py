"""The Kubernetes adapter against sim's API emulator: calls, error mapping, list + watch with
resume, bookmarks and 410, and how its threads start and end."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import urllib3
from gpushare_common.adapters import kubeclient
from gpushare_common.adapters.kube import Closed, Conflict, Gone, Invalid, Kube, NotFound, PodChange, Retryable
from gpushare_common.settings import KubeSettings
from gpushare_sim.apiserver import ApiSettings
from gpushare_sim.apiserver.server import write_kubeconfig
from kubernetes.client import ApiException

from tests.support import threads as support_threads
from tests.support.kubeapi import KubeApi, start_kube_api


def pod(name: str, node: str = "n1", labels: dict[str, str] | None = None) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]}}


@pytest.fixture
async def kube(kube_api: KubeApi) -> AsyncIterator[Kube]:
    kube_api.namespaces("ml", "ns")
    client = Kube(KubeSettings(kubeconfig=str(kube_api.kubeconfig), watch_timeout_s=5))
    yield client
    await client.close()


async def test_crud_patch_and_errors(kube: Kube) -> None:
    created = await kube.create_pod("ml", pod("a"))
    assert created["metadata"]["uid"]
    with pytest.raises(Conflict):
        await kube.create_pod("ml", pod("a"))
    patched = await kube.patch_pod("ml", "a", {"metadata": {"annotations": {"k": "v"}}})
    assert patched["metadata"]["annotations"] == {"k": "v"}
    condition = {"type": "gpushare.k8s.io/Using", "status": "True", "reason": "ml/x"}
    status = await kube.patch_pod_status("ml", "a", {"status": {"conditions": [condition]}})
    assert status["status"]["conditions"][0]["type"] == "gpushare.k8s.io/Using"
    pods, version = await kube.list_pods(field_selector="spec.nodeName=n1")
    assert [p["metadata"]["name"] for p in pods] == ["a"] and version
    with pytest.raises(NotFound, match='get pod ml/missing: 404 pods "missing" not found'):
        await kube.get_pod("ml", "missing")
    with pytest.raises(Invalid):
        await kube.list_pods(field_selector="spec.bogus==")
    with pytest.raises(Conflict):  # a precondition that does not hold
        await kube.delete_pod("ml", "a", uid="not-its-uid")
    assert (await kube.delete_pod("ml", "a", grace_seconds=0)) is not None


async def test_a_call_after_close_is_the_adapters_error_and_sends_nothing(kube_api: KubeApi) -> None:
    client = Kube(KubeSettings(kubeconfig=str(kube_api.kubeconfig)))
    await client.close()
    with pytest.raises(Closed, match="get pod ml/a: the Kubernetes client is closed"):
        await client.get_pod("ml", "a")


@pytest.mark.parametrize(("error", "expected"), [
    (ApiException(status=404, reason="Not Found"), NotFound),
    (ApiException(status=409, reason="Conflict"), Conflict),
    (ApiException(status=410, reason="Expired"), Gone),
    (ApiException(status=422, reason="Invalid"), Invalid),
    (ApiException(status=400, reason="Bad Request"), Invalid),
    (ApiException(status=401, reason="Unauthorized"), Retryable),
    (ApiException(status=403, reason="Forbidden"), Retryable),
    (ApiException(status=429, reason="Too Many Requests"), Retryable),
    (ApiException(status=503, reason="Unavailable"), Retryable),
    (ApiException(status=0, reason="SSLError: certificate verify failed"), Retryable),
    (urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out"), Retryable),
    (urllib3.exceptions.ProtocolError("Connection broken"), Retryable),
    (ConnectionResetError(104, "reset"), Retryable),
])
def test_the_packages_errors_become_the_adapters(error: Exception, expected: type[Exception]) -> None:
    with pytest.raises(expected) as raised, kubeclient.mapped("get pod ml/a"):
        raise error
    assert str(raised.value).startswith("get pod ml/a: ") and str(getattr(error, "reason", "")) in str(raised.value)
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


async def test_a_server_that_is_not_there_is_retryable(tmp_path: Path) -> None:
    with socket.socket() as bound:  # bound, never listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}"
        kube = Kube(KubeSettings(kubeconfig=str(write_kubeconfig(tmp_path / "cfg", url)), qps_timeout_s=2))
        try:
            with pytest.raises(Retryable, match="get node n1"):
                await kube.get_node("n1")
        finally:
            await kube.close()


OwnThreads = Callable[[str], list[threading.Thread]]


@pytest.fixture
def own_threads() -> OwnThreads:
    """This test's live threads named ``prefix``: another test in this worker process may have left
    a client of its own open, whose threads are not this test's to count."""
    before = support_threads.snapshot()
    return lambda prefix: support_threads.born_since(before, prefix)


async def test_calls_run_on_the_adapters_own_few_threads(own_threads: OwnThreads, kube_api: KubeApi) -> None:
    kube_api.namespaces("ml")
    kube = Kube(KubeSettings(kubeconfig=str(kube_api.kubeconfig), threads=2))
    seen: set[str] = set()
    try:
        ticks = 0

        async def ticking() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                seen.update(t.name for t in own_threads("kube-call"))
                await asyncio.sleep(0)

        ticker = asyncio.create_task(ticking())
        created = await asyncio.gather(*(kube.create_pod("ml", pod(f"p{i}")) for i in range(16)))
        ticker.cancel()
        assert len(created) == 16 and ticks > 16  # the loop kept running while the calls were out
        assert 1 <= len(seen) <= 2
    finally:
        await kube.close()
    await wait_until(lambda: not own_threads("kube-call"))


async def _collect(kube: Kube, stop: asyncio.Event, out: list[PodChange], **kw: str) -> None:
    async for change in kube.watch_pods(stop, **kw):
        out.append(change)


async def wait_until(predicate: Callable[[], object], timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


def names(changes: list[PodChange], kind: str) -> list[str]:
    return [c.pod["metadata"]["name"] for c in changes if c.kind == kind and c.pod]


def syncs(changes: list[PodChange]) -> int:
    return sum(c.kind == "SYNC" for c in changes)


async def test_watch_syncs_then_streams_changes(kube: Kube) -> None:
    await kube.create_pod("ml", pod("before"))
    stop, changes = asyncio.Event(), []
    task = asyncio.create_task(_collect(kube, stop, changes, field_selector="spec.nodeName=n1"))
    await wait_until(lambda: changes and changes[0].kind == "SYNC")
    assert [p["metadata"]["name"] for p in changes[0].pods] == ["before"]
    await kube.create_pod("ml", pod("after"))
    await kube.create_pod("ml", pod("elsewhere", node="n2"))
    await kube.delete_pod("ml", "before", grace_seconds=0)
    await wait_until(lambda: "after" in names(changes, "ADDED") and "before" in names(changes, "DELETED"))
    assert "elsewhere" not in {c.pod["metadata"]["name"] for c in changes[1:] if c.pod}
    stop.set()
    await asyncio.wait_for(task, 5)


def watch_versions(api: KubeApi) -> Callable[[], list[int]]:
    """The resourceVersion each open pod watch on the emulator started after."""
    return lambda: api.server.call(lambda: [w.after for w in api.store.watchers.get("pods", ())])


async def test_watch_relists_after_410() -> None:
    with start_kube_api(ApiSettings(history=3), namespaces=("ml",)) as api:
        kube = Kube(KubeSettings(kubeconfig=str(api.kubeconfig), watch_timeout_s=2))
        first = await kube.create_pod("ml", pod("p0"))
        for i in range(1, 20):
            await kube.create_pod("ml", pod(f"p{i}"))
        stop, changes = asyncio.Event(), []
        stale = first["metadata"]["resourceVersion"]
        task = asyncio.create_task(_collect(kube, stop, changes, resource_version=stale))
        await wait_until(lambda: changes)
        assert changes[0].kind == "SYNC" and len(changes[0].pods) == 20
        stop.set()
        await asyncio.wait_for(task, 5)
        await kube.close()


async def test_a_watch_the_server_ends_resumes_from_the_last_version_without_a_relist(kube_api: KubeApi) -> None:
    kube_api.namespaces("ml")
    kube = Kube(KubeSettings(kubeconfig=str(kube_api.kubeconfig), watch_timeout_s=1))
    stop, changes = asyncio.Event(), []
    task = asyncio.create_task(_collect(kube, stop, changes))
    await wait_until(lambda: syncs(changes) == 1)
    version = int((await kube.create_pod("ml", pod("a")))["metadata"]["resourceVersion"])
    await wait_until(lambda: names(changes, "ADDED") == ["a"])
    opened = watch_versions(kube_api)
    await wait_until(lambda: any(after >= version for after in opened()))  # the next watch request
    await kube.create_pod("ml", pod("b"))
    await wait_until(lambda: names(changes, "ADDED") == ["a", "b"])
    stop.set()
    await asyncio.wait_for(task, 5)
    await kube.close()
    assert syncs(changes) == 1 and names(changes, "ADDED") == ["a", "b"]


async def test_bookmarks_keep_the_resume_version_fresh() -> None:
    """Changes the watch does not select move the server's history on; the bookmarks carry the
    new version, so the next watch request starts there instead of failing with 410."""
    with start_kube_api(ApiSettings(history=3, bookmark_interval=0.05), namespaces=("ml",)) as api:
        kube = Kube(KubeSettings(kubeconfig=str(api.kubeconfig), watch_timeout_s=2))
        stop, changes = asyncio.Event(), []
        task = asyncio.create_task(_collect(kube, stop, changes, field_selector="spec.nodeName=n1"))
        await wait_until(lambda: syncs(changes) == 1)
        opened = watch_versions(api)
        await wait_until(lambda: len(opened()) == 1)
        for i in range(8):  # on another node: never sent to this watch
            last = int((await kube.create_pod("ml", pod(f"other-{i}", node="n2")))["metadata"]["resourceVersion"])
        await wait_until(lambda: any(after >= last for after in opened()))
        await kube.create_pod("ml", pod("mine"))
        await wait_until(lambda: names(changes, "ADDED") == ["mine"])
        stop.set()
        await asyncio.wait_for(task, 5)
        await kube.close()
    assert syncs(changes) == 1


async def test_stop_ends_a_watch_blocked_in_its_read_at_once(own_threads: OwnThreads) -> None:
    with start_kube_api(ApiSettings(bookmark_interval=3600), namespaces=("ml",)) as api:
        kube = Kube(KubeSettings(kubeconfig=str(api.kubeconfig), watch_timeout_s=300))
        stop, changes = asyncio.Event(), []
        task = asyncio.create_task(_collect(kube, stop, changes))
        await wait_until(lambda: syncs(changes) == 1 and len(watch_versions(api)()) == 1)
        assert len(own_threads("kube-watch-pods")) == 1  # one reading thread per open watch
        stop.set()
        await asyncio.wait_for(task, 2)  # the server would keep it open for five minutes
        await wait_until(lambda: not own_threads("kube-watch-pods"), timeout=2)
        await kube.close()


async def test_cancelling_the_watching_task_ends_the_watch(
        own_threads: OwnThreads, kube: Kube, kube_api: KubeApi) -> None:  # fmt: skip
    stop, changes = asyncio.Event(), []
    task = asyncio.create_task(_collect(kube, stop, changes))
    await wait_until(lambda: syncs(changes) == 1 and len(watch_versions(kube_api)()) == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: not own_threads("kube-watch-pods"), timeout=2)
    await wait_until(lambda: not watch_versions(kube_api)(), timeout=5)  # the server saw it go


async def test_watch_pod_sets_yields_the_whole_set_after_each_change(kube: Kube) -> None:
    await kube.create_pod("ml", pod("a"))
    stop, sets = asyncio.Event(), []

    async def collect() -> None:
        async for pods in kube.watch_pod_sets(stop, field_selector="spec.nodeName=n1"):
            sets.append(sorted(p["metadata"]["name"] for p in pods))

    task = asyncio.create_task(collect())
    await wait_until(lambda: sets == [["a"]])
    await kube.create_pod("ml", pod("b"))
    await wait_until(lambda: sets[-1] == ["a", "b"])
    await kube.delete_pod("ml", "a", grace_seconds=0)
    await wait_until(lambda: sets[-1] == ["b"])
    stop.set()
    await asyncio.wait_for(task, 5)
