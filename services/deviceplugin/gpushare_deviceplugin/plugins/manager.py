"""Every plugin of the node in one place: built from settings, fed by events."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpushare_common import events
from gpushare_common.isolation import SOFT_SHARE
from gpushare_common.logging import get_logger

from ..devices import Health
from ..handlers.base import PluginLogic, Signer
from ..handlers.capacity import CapacityLogic
from ..handlers.share import ShadowPodView, ShareLogic, share_resource_token
from ..handlers.spot import SpotLogic
from ..settings import DevicePluginSettings
from .metrics import PluginMetrics
from .plugin import DevicePlugin

log = get_logger("deviceplugin.manager")
SPOT_TOKEN = "spot-gpu"


def build_logics(settings: DevicePluginSettings, signer: Signer) -> dict[str, PluginLogic]:
    """``{resource token: logic}`` for every plugin the settings ask for."""
    domain = settings.domain
    logics: dict[str, PluginLogic] = {}
    for kind, specs in (("share", settings.share_specs), ("share-dev", settings.share_dev_specs)):
        for spec in specs:
            token = share_resource_token(kind, spec)
            logics[token] = ShareLogic(f"{domain}/{token}", spec, signer, settings.policy,
                                       settings.card_memory(), kind in settings.isolation_opt_out)
    if settings.spot:
        logics[SPOT_TOKEN] = SpotLogic(f"{domain}/{SPOT_TOKEN}", signer)
    for token in settings.capacity_resources:
        logics[token] = CapacityLogic(f"{domain}/{token}", token)
    return logics


class PluginSet:
    """The node's plugins by resource token, and the event handlers that feed them."""

    def __init__(self, settings: DevicePluginSettings, signer: Signer,
                 metrics: PluginMetrics) -> None:
        self.node_domain = settings.domain
        self.metrics = metrics
        self.logics = build_logics(settings, signer)
        self.plugins = [DevicePlugin(logic, settings.plugin_dir, metrics, settings.resend_s)
                        for logic in self.logics.values()]
        self._health_ts: dict[str, float] = {}

    @property
    def spot(self) -> SpotLogic | None:
        logic = self.logics.get(SPOT_TOKEN)
        return logic if isinstance(logic, SpotLogic) else None

    def share(self) -> dict[str, ShareLogic]:
        return {t: lg for t, lg in self.logics.items() if isinstance(lg, ShareLogic)}

    def apply(self, event: events.AnyEvent) -> bool:
        """Feed one NATS event to the plugin it concerns; False when none does."""
        match event:
            case events.DeviceHealth():
                return self._health(event)
            case events.SpareCapacity():
                logic = self.logics.get(event.resource)
                if isinstance(logic, CapacityLogic):
                    logic.set_capacity(event.devices, event.unit)
                    return True
            case events.SpotEvent():
                spot = self.spot
                if spot is not None:
                    devices = event.devices if event.state == "using" else ()
                    spot.set_borrowed(f"{event.pod}/{event.container}", devices)
                    return True
        return False

    def _health(self, event: events.DeviceHealth) -> bool:
        logic = self.logics.get(event.resource)
        if logic is None:
            return False
        if event.ts < self._health_ts.get(event.resource, 0.0):
            log.info("stale health ignored", resource=event.resource, id=event.id)
            return False
        self._health_ts[event.resource] = event.ts
        logic.apply_health(event.devices, event.full)
        return True

    def served(self, resource: str, devices: Iterable[str]) -> dict[str, Health]:
        """The health each of ``devices`` of ``resource`` is served with now (unknown ones left out)."""
        logic = self.logics.get(resource)
        if logic is None:
            return {}
        return {d: h for d in devices if (h := logic.board.health(d)) is not None}

    def replace_shadows(self, shadows: Iterable[ShadowPodView]) -> None:
        """A full snapshot of this node's Running ShadowPods, routed by spec and kind."""
        grouped: dict[str, list[ShadowPodView]] = {t: [] for t in self.share()}
        for shadow in shadows:
            token = shadow.resource_token()
            if token in grouped:
                grouped[token].append(shadow)
            else:
                log.warning("ShadowPod of a spec no plugin serves", pod=shadow.key,
                            resource=token)
        for token, logic in self.share().items():
            before = set(logic.shadows)
            logic.replace_shadows(grouped[token])
            added, removed = set(logic.shadows) - before, before - set(logic.shadows)
            if added or removed:
                log.info("ShadowPods changed", resource=logic.resource,
                         added=",".join(sorted(added)) or None,
                         removed=",".join(sorted(removed)) or None, devices=len(logic.board.devices()))
        self._export_isolation()

    def _export_isolation(self) -> None:
        """``gpushare_share_isolation{resource, isolation}``: the profiles each share resource serves."""
        self.metrics.share_isolation.clear()
        for logic in self.share().values():
            for profile in {s.isolation or SOFT_SHARE for s in logic.shadows.values()}:
                self.metrics.share_isolation.labels(logic.resource, profile).set(1)

    def status(self) -> dict[str, Any]:
        return {"plugins": [p.status() for p in self.plugins]}
