"""ShareGPU against the API emulator: the Using condition (status patch) and the owner annotation."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from gpushare_common.adapters.kube import Kube
from gpushare_common.events import ShadowEvent, ShareEvent
from gpushare_common.ids import ANN_DEVICE_OWNER, CONDITION_USING
from gpushare_common.settings import NatsSettings
from gpushare_solver import app
from gpushare_solver.settings import SolverSettings

from tests.solver.conftest import NODE, wait_for
from tests.solver.fakes import FakeTasks
from tests.solver.world import client_bus, common_settings, pod_body
from tests.support.kubeapi import KubeApi


def using(pod: dict[str, object]) -> dict[str, str] | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:  # type: ignore[attr-defined]
        if condition["type"] == CONDITION_USING:
            return {"status": condition["status"], "message": condition["message"]}
    return None


async def test_using_condition_and_owner_annotation_in_the_api(
    nats_settings: NatsSettings, kube_api: KubeApi, kube: Kube,
) -> None:
    await kube.create_pod("team", pod_body("shadow", NODE, ["s"]))
    await kube.create_pod("apps", pod_body("infer", NODE, ["i"]))
    await kube.patch_pod_status("team", "shadow", {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True"}]}}, strategic=True)
    stop = asyncio.Event()
    async with client_bus(nats_settings) as bus, app.Service(
            common_settings(nats_settings, Path(kube_api.kubeconfig), NODE), SolverSettings(), stop,
            pods=kube, tasks_api=FakeTasks()).started():
        for event in (
            ShadowEvent(node=NODE, shadow_pod="team/shadow", state="running", resource="share-gpu-2",
                        share_spec=2),
            ShareEvent(node=NODE, share_pod="apps/infer", container="c0", resource="share-gpu-2",
                       state="using", devices=("team/shadow-1",)),
        ):
            await bus.publish_persistent(bus.subjects.event(NODE, type(event).__struct_config__.tag), event)

        async def condition() -> dict[str, str] | None:
            return using(await kube.get_pod("team", "shadow"))

        await wait_for(condition, what="the Using condition")
        assert await condition() == {"status": "True", "message": json.dumps({"team/shadow-1": "apps/infer"},
                                                                             separators=(",", ":"))}
        shadow = await kube.get_pod("team", "shadow")
        assert any(c["type"] == "Ready" for c in shadow["status"]["conditions"])  # other conditions kept
        share = await kube.get_pod("apps", "infer")
        assert share["metadata"]["annotations"][ANN_DEVICE_OWNER] == "team/shadow"

        cleared = ShareEvent(node=NODE, share_pod="apps/infer", container="c0", resource="share-gpu-2",
                             state="cleared", devices=("team/shadow-1",))
        await bus.publish_persistent(bus.subjects.event(NODE, "share"), cleared)

        async def freed() -> bool:
            found = await condition()
            return found is not None and found["status"] == "False"

        await wait_for(freed, what="the condition cleared")
        stop.set()
