"""Carry out a plan's actions in order; reclaims resume from their persisted progress."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from gpushare_common.adapters.kube import NotFound
from gpushare_common.bus import BusError
from gpushare_common.events import DeviceHealth, Health, KmodCommand
from gpushare_common.ids import ANN_DEVICE_OWNER, CONDITION_USING, parse_pod_key
from gpushare_common.logging import get_logger
from gpushare_common.subjects import Subjects

from .actions import (
    Action,
    DeviceList,
    Kmod,
    OwnerAnnotation,
    Plan,
    Reclaim,
    ReclaimProgress,
    SetHealth,
    UsingCondition,
)
from .ports import Obj, Outbox, PodApi
from .reclaim import Reclaimer
from .spot import OWNER_BACK
from .taints import DeviceTaints

log = get_logger("solver.executor")
SavePlan = Callable[[Plan], Awaitable[None]]


def using_condition(users: dict[str, str]) -> Obj:
    """The ShadowPod's ``Using`` condition: which SharePod uses which virtual device."""
    return {
        "type": CONDITION_USING,
        "status": "True" if users else "False",
        "reason": "Shared" if users else "Free",
        "message": json.dumps(dict(sorted(users.items())), separators=(",", ":")),
        "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


class Executor:
    def __init__(self, node: str, subjects: Subjects, pods: PodApi, outbox: Outbox,
                 reclaimer: Reclaimer, taints: DeviceTaints | None = None) -> None:
        self.node = node
        self.subjects = subjects
        self.pods = pods
        self.outbox = outbox
        self.reclaimer = reclaimer
        self.taints = taints
        self._spot = reclaimer.settings.spot_resource

    async def run(self, plan: Plan, save: SavePlan) -> None:
        for index in range(plan.done, len(plan.actions)):
            action = plan.actions[index]
            if isinstance(action, Reclaim):
                progress = plan.progress.setdefault(index, ReclaimProgress())
                await self.reclaimer.run(action, progress, plan.trigger_id, plan.received,
                                         lambda: save(plan))
                await self._taint_after(plan, action)
                plan.done = index + 1
                await save(plan)
            else:
                await self.apply(action)
                plan.done = index + 1

    async def _taint_after(self, plan: Plan, action: Reclaim) -> None:
        """On a DRA node, once an owner-back's borrowers are dead and the owner released: taint
        the spot devices the plan withdrew (safe to repeat)."""
        if self.taints is None or action.reason != OWNER_BACK:
            return
        withdrawn = [d for a in plan.actions if isinstance(a, SetHealth) and a.resource == self._spot
                     for d, h in a.devices.items() if h == "Unhealthy"]
        await self.taints.taint(withdrawn, action.owner)

    async def apply(self, action: Action) -> None:
        match action:
            case SetHealth():
                await self._publish_health(action.resource, action.devices, False, action.reason)
                lent = [d for d, h in action.devices.items() if h == "Healthy"]
                if self.taints is not None and lent and action.resource == self._spot:
                    await self.taints.untaint(lent)
            case DeviceList():
                healthy: dict[str, Health] = dict.fromkeys(action.devices, "Healthy")
                await self._publish_health(action.resource, healthy, True, action.reason)
            case Kmod():
                await self._kmod(action)
            case UsingCondition():
                await self._patch_status(action)
            case OwnerAnnotation():
                await self._annotate(action)
            case _:
                raise TypeError(f"unknown action {action!r}")

    async def _publish_health(self, resource: str, devices: dict[str, Health], full: bool,
                              reason: str) -> None:
        event = DeviceHealth(node=self.node, resource=resource, devices=devices, full=full, reason=reason)
        await self.outbox.publish(self.subjects.health(self.node, resource), event)

    async def _kmod(self, action: Kmod) -> None:
        command = KmodCommand(node=self.node, op=action.op, pods=action.pods, pidns=action.pidns,
                              reason=action.reason)
        try:
            reply = await self.reclaimer.kmod(command)
        except BusError as err:  # best effort: without detect the owner's return is seen by utilisation
            log.warning("kmod command not delivered", node=self.node, op=action.op,
                        pods=",".join(action.pods), error=str(err))
            return
        if reply.status < 0:  # a negative errno; >= 0 is success (release: owners woken)
            log.warning("kernel refused command", node=self.node, op=action.op,
                        pods=",".join(action.pods), status=reply.status, message=reply.message)

    async def _patch_status(self, action: UsingCondition) -> None:
        namespace, name = parse_pod_key(action.shadow_pod)
        patch = {"status": {"conditions": [using_condition(action.users)]}}
        try:
            await self.pods.patch_pod_status(namespace, name, patch, strategic=True)
        except NotFound:
            log.info("ShadowPod gone before its condition was set", node=self.node, pod=action.shadow_pod)

    async def _annotate(self, action: OwnerAnnotation) -> None:
        namespace, name = parse_pod_key(action.share_pod)
        patch = {"metadata": {"annotations": {ANN_DEVICE_OWNER: action.shadow_pod}}}
        try:
            await self.pods.patch_pod(namespace, name, patch)
        except NotFound:
            log.info("SharePod gone before its owner annotation was set", node=self.node,
                     pod=action.share_pod)
