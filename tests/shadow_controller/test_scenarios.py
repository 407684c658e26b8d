"""The shadow-controller against sim's API emulator with the official client."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from gpushare_common import ids
from gpushare_common.adapters.kube import Kube
from gpushare_common.settings import HttpSettings, KubeSettings
from gpushare_shadow_controller.app import Service
from gpushare_shadow_controller.controller import Controller
from gpushare_shadow_controller.settings import Settings, ShadowSettings
from prometheus_client import CollectorRegistry

from tests.support.kubeapi import KubeApi

SYSTEM = "gpushare-system"


def share_pod(name: str, resource: str = "gpushare/share-gpu-4", node: str = "",
              owner: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml"}
    if owner:
        meta["annotations"] = {ids.ANN_DEVICE_OWNER: owner}
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x",
                                            "resources": {"requests": {resource: "1"}}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


async def wait_until(predicate: Callable[[], Any], timeout: float = 15) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.02)


async def shadow_pods(kube: Kube) -> list[dict[str, Any]]:
    pods, _ = await kube.list_pods(label_selector=f"{ids.LABEL_POD_DESCRIPTION}=shadow-pod")
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def settings(api: KubeApi, **shadow: Any) -> Settings:
    return Settings(
        shadow=ShadowSettings(lease_namespace="gpushare-system", identity=shadow.pop("identity", "a"),
                              resync_s=0.2, **shadow),
        kube=KubeSettings(kubeconfig=str(api.kubeconfig), watch_timeout_s=5),
        http=HttpSettings(host="127.0.0.1", port=0))


async def test_five_pending_pods_get_exactly_two_shadowpods(kube_api: KubeApi) -> None:
    kube = Kube(KubeSettings(kubeconfig=str(kube_api.kubeconfig)))
    for i in range(5):
        await kube.create_pod("ml", share_pod(f"infer-{i}"))
    stop = asyncio.Event()
    app = Service(settings(kube_api), Kube(KubeSettings(kubeconfig=str(kube_api.kubeconfig))), stop)
    runner = asyncio.create_task(app.run())

    async def two_exist() -> bool:
        return len(await shadow_pods(kube)) == 2
    await wait_until(two_exist)
    passes = app.controller.passes
    for round_no in range(10):  # many overlapping passes: touch the pending pods
        for i in range(5):
            await kube.patch_pod("ml", f"infer-{i}", {"metadata": {"labels": {"round": str(round_no)}}})

    async def many_passes() -> bool:
        return app.controller.passes >= passes + 10
    await wait_until(many_passes)
    created = await shadow_pods(kube)
    assert len(created) == 2
    pod = created[0]
    assert pod["metadata"]["annotations"] == {ids.ANN_SHARE_KIND: "share", ids.ANN_SHARE_SPEC: "4"}
    assert pod["spec"]["containers"][0]["name"] == "main"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    status = app.status_view()  # as /status serves it, checked against its model
    assert status.quota["gpushare-system/share-gpu-4"].pipelining == -5  # type: ignore[attr-defined]
    assert {p["metadata"]["namespace"] for p in created} == {SYSTEM}  # never in the tenant's namespace
    stop.set()
    assert await runner == 0


async def test_idle_shadowpod_retired_after_timeout_not_before(kube_api: KubeApi) -> None:
    kube = Kube(KubeSettings(kubeconfig=str(kube_api.kubeconfig)))
    now = [1000.0]
    controller = Controller(kube, ShadowSettings(idle_timeout_s=60), CollectorRegistry(),
                            lambda: True, clock=lambda: now[0])
    await kube.create_pod("ml", share_pod("user-1"))
    stop = asyncio.Event()

    async def watch() -> None:
        async for change in kube.watch_pods(stop):
            controller.apply(change)
    watcher = asyncio.create_task(watch())
    await wait_until(lambda: _async(bool(controller.records)))
    assert len((await controller.reconcile()).creates) == 1
    (shadow,) = await shadow_pods(kube)
    name = shadow["metadata"]["name"]
    await kube.patch_pod_status(SYSTEM, name, {"status": {"phase": "Running"}}, strategic=False)
    await kube.delete_pod("ml", "user-1", grace_seconds=0)
    await kube.create_pod("ml", share_pod("user-2", node="n1", owner=f"{SYSTEM}/{name}"))
    await wait_until(lambda: _async("ml/user-2" in controller.records and "ml/user-1" not in controller.records))
    await controller.reconcile()
    now[0] += 3600  # in use: never retired
    assert (await controller.reconcile()).deletes == []
    await kube.delete_pod("ml", "user-2", grace_seconds=0)
    await wait_until(lambda: _async("ml/user-2" not in controller.records))
    await controller.reconcile()  # idle from now
    now[0] += 59
    assert (await controller.reconcile()).deletes == []
    now[0] += 1
    assert [d.shadow for d in (await controller.reconcile()).deletes] == [f"{SYSTEM}/{name}"]
    assert await shadow_pods(kube) == []
    stop.set()
    await watcher


async def _async(value: bool) -> bool:
    return value


def _start_controller(api: KubeApi, identity: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GPUSHARE_KUBE_KUBECONFIG": str(api.kubeconfig), "GPUSHARE_HTTP_PORT": "0",
           "GPUSHARE_HTTP_HOST": "127.0.0.1", "GPUSHARE_SHADOW_IDENTITY": identity,
           "GPUSHARE_SHADOW_LEASE_DURATION_S": "2", "GPUSHARE_SHADOW_RENEW_EVERY_S": "0.5"}
    return subprocess.Popen([sys.executable, "-m", "gpushare_shadow_controller"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def test_two_processes_one_leader_and_failover(kube_api: KubeApi) -> None:
    kube = Kube(KubeSettings(kubeconfig=str(kube_api.kubeconfig)))
    first = _start_controller(kube_api, "first")
    second = _start_controller(kube_api, "second")
    try:
        async def holder() -> str:
            try:
                lease = await kube.get_lease("gpushare-system", "gpushare-shadow-controller")
            except Exception:
                return ""
            return str(lease["spec"].get("holderIdentity") or "")

        async def has_holder() -> bool:
            return await holder() in ("first", "second")
        await wait_until(has_holder, 30)
        leader = await holder()
        victim, survivor = (first, "second") if leader == "first" else (second, "first")
        victim.kill()
        victim.wait()

        async def moved() -> bool:
            return await holder() == survivor
        await wait_until(moved, 30)
    finally:
        for proc in (first, second):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def test_a_tenants_fake_shadow_pod_is_no_supply(kube_api: KubeApi) -> None:
    """A pod a tenant labels as a ShadowPod in its own namespace neither counts as supply (the
    controller still creates a real one) nor is ever retired by it."""
    kube = Kube(KubeSettings(kubeconfig=str(kube_api.kubeconfig)))
    fake = share_pod("fake", resource="nvidia.com/gpu")
    fake["metadata"]["labels"] = {ids.LABEL_POD_DESCRIPTION: ids.SHADOW_POD_LABEL_VALUE,
                                  "app.kubernetes.io/managed-by": "gpushare-shadow-controller"}
    fake["metadata"]["annotations"] = {ids.ANN_SHARE_SPEC: "4", ids.ANN_SHARE_KIND: "share"}
    await kube.create_pod("ml", fake)
    await kube.create_pod("ml", share_pod("user-1"))
    controller = Controller(kube, ShadowSettings(idle_timeout_s=0), CollectorRegistry(), lambda: True)
    stop = asyncio.Event()

    async def watch() -> None:
        async for change in kube.watch_pods(stop):
            controller.apply(change)
    watcher = asyncio.create_task(watch())
    await wait_until(lambda: _async("ml/user-1" in controller.records))
    assert "ml/fake" not in controller.records
    (created,) = (await controller.reconcile()).creates
    assert created.quota.namespace == SYSTEM and (await controller.reconcile()).deletes == []
    stop.set()
    await watcher
