"""MPS daemon death reported on every SharePod, by the running controller against sim's API emulator."""

from __future__ import annotations

import asyncio
from typing import Any

import kubernetes
from gpushare_common import ids
from gpushare_common.adapters.kube import Kube
from gpushare_common.settings import KubeSettings
from gpushare_shadow_controller.app import Service

from tests.shadow_controller.test_scenarios import SYSTEM, settings, share_pod, wait_until
from tests.support.kubeapi import KubeApi

SHADOW = "gpushare-shadow-share-4-abc123"
OWNER = f"{SYSTEM}/{SHADOW}"


def mps_shadow_pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": SHADOW, "namespace": SYSTEM,
                         "labels": {ids.LABEL_POD_DESCRIPTION: ids.SHADOW_POD_LABEL_VALUE,
                                    "app.kubernetes.io/managed-by": "gpushare-shadow-controller"},
                         "annotations": {ids.ANN_SHARE_KIND: "share", ids.ANN_SHARE_SPEC: "4",
                                         ids.ANN_ISOLATION: "mps"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "cuda",
                                                       "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


async def set_shadow(kube: Kube, ready: bool, restarts: int = 0) -> None:
    await kube.patch_pod_status(SYSTEM, SHADOW, {"status": {
        "phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}],
        "containerStatuses": [{"name": "main", "restartCount": restarts, "ready": ready}]}}, strategic=False)


async def caps_condition(kube: Kube, name: str) -> dict[str, Any] | None:
    pod = await kube.get_pod("ml", name)
    found = [c for c in pod["status"].get("conditions") or [] if c["type"] == ids.CONDITION_CAPS_ENFORCED]
    return found[0] if found else None


async def events(api: KubeApi) -> list[Any]:
    core = kubernetes.client.CoreV1Api(api.new_client())
    listed = await asyncio.to_thread(core.list_namespaced_event, "ml")
    return [e for e in listed.items if e.source.component == "gpushare-shadow-controller"]


async def test_a_dead_mps_daemon_is_reported_on_every_sharepod_until_it_is_back(kube_api: KubeApi) -> None:
    kube = Kube(KubeSettings(kubeconfig=str(kube_api.kubeconfig)))
    await kube.create_pod(SYSTEM, mps_shadow_pod())
    await set_shadow(kube, ready=True)
    for name in ("a", "b", "c"):
        body = share_pod(name, node="n1", owner=OWNER)
        if name == "c":  # opted out of its caps: nothing to tell it
            body["metadata"]["annotations"][ids.ANN_ISOLATION] = "none"
        await kube.create_pod("ml", body)
        await kube.patch_pod_status("ml", name, {"status": {"phase": "Running"}}, strategic=False)
    stop = asyncio.Event()
    app = Service(settings(kube_api), Kube(KubeSettings(kubeconfig=str(kube_api.kubeconfig))), stop)
    runner = asyncio.create_task(app.run())

    async def passes(count: int) -> bool:
        return app.controller.passes >= count

    async def conditions(status: str, reason: str) -> bool:
        found = [await caps_condition(kube, n) for n in ("a", "b")]
        return all(c is not None and (c["status"], c["reason"]) == (status, reason) for c in found)

    async def told(count: int) -> bool:
        return len(await events(kube_api)) >= count

    try:
        await wait_until(lambda: passes(2))
        assert await events(kube_api) == [] and await caps_condition(kube, "a") is None

        await set_shadow(kube, ready=False)  # the readiness probe fails: the daemon died
        await wait_until(lambda: conditions("False", "MPSDaemonDown"))
        await wait_until(lambda: told(2))
        warnings = await events(kube_api)
        assert sorted(e.involved_object.name for e in warnings) == ["a", "b"]
        for event in warnings:
            assert (event.type, event.reason, event.related.name) == ("Warning", "CapsNotEnforced", SHADOW)
            assert f"ShadowPod {OWNER} (nvidia.com/gpu on node n1) is down" in event.message
            assert event.involved_object.uid
        assert await caps_condition(kube, "c") is None
        assert app.status()["caps"] == {"mps_daemons_down": [OWNER], "not_enforced": ["ml/a", "ml/b"]}
        done = app.controller.passes
        for round_no in range(3):  # more passes tell nobody again
            await kube.patch_pod("ml", "a", {"metadata": {"labels": {"round": str(round_no)}}})
        await wait_until(lambda: passes(done + 3))
        assert len(await events(kube_api)) == 2

        await set_shadow(kube, ready=True)
        await wait_until(lambda: conditions("True", "MPSDaemonUp"))
        await wait_until(lambda: told(4))
        recovered = [e for e in await events(kube_api) if e.type == "Normal"]
        assert sorted((e.involved_object.name, e.reason) for e in recovered) == [
            ("a", "CapsEnforced"), ("b", "CapsEnforced")]

        await set_shadow(kube, ready=True, restarts=1)  # main restarted between two looks
        await wait_until(lambda: conditions("True", "MPSDaemonRestarted"))
        await wait_until(lambda: told(6))
        restarted = [e for e in await events(kube_api) if "restarted" in e.message]
        assert {(e.type, e.reason) for e in restarted} == {("Warning", "CapsNotEnforced")}

        sample = app.registry.get_sample_value
        assert sample("gpushare_shadow_caps_reports_total", {"reason": "MPSDaemonDown"}) == 2
        assert sample("gpushare_shadow_caps_reports_total", {"reason": "MPSDaemonUp"}) == 2
        assert sample("gpushare_shadow_caps_reports_total", {"reason": "MPSDaemonRestarted"}) == 2
        assert sample("gpushare_shadow_mps_daemons_down", {}) == 0
        assert sample("gpushare_shadow_write_errors_total", {}) == 0
    finally:
        stop.set()
        assert await runner == 0
