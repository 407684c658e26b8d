"""The Kubernetes adapter against sim's API emulator, through the official client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from gpushare_common.adapters.kube import Conflict, Invalid, Kube, NotFound, PodChange
from gpushare_common.settings import KubeSettings
from gpushare_sim.apiserver import ApiSettings

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
    with pytest.raises(NotFound):
        await kube.get_pod("ml", "missing")
    with pytest.raises(Invalid):
        await kube.list_pods(field_selector="spec.bogus==")


async def _collect(kube: Kube, stop: asyncio.Event, out: list[PodChange], **kw: str) -> None:
    async for change in kube.watch_pods(stop, **kw):
        out.append(change)


async def wait_until(predicate, timeout: float = 10) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_watch_syncs_then_streams_changes(kube: Kube) -> None:
    await kube.create_pod("ml", pod("before"))
    stop, changes = asyncio.Event(), []
    task = asyncio.create_task(_collect(kube, stop, changes, field_selector="spec.nodeName=n1"))
    await wait_until(lambda: changes and changes[0].kind == "SYNC")
    assert [p["metadata"]["name"] for p in changes[0].pods] == ["before"]
    await kube.create_pod("ml", pod("after"))
    await kube.create_pod("ml", pod("elsewhere", node="n2"))
    await kube.delete_pod("ml", "before", grace_seconds=0)
    await wait_until(lambda: any(c.kind == "ADDED" for c in changes)
                     and any(c.kind in ("MODIFIED", "DELETED") for c in changes))
    names = {c.pod["metadata"]["name"] for c in changes[1:] if c.pod}
    assert "elsewhere" not in names and "after" in names
    stop.set()
    await asyncio.wait_for(task, 5)


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
