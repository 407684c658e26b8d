"""Lifecycle: watch pods, elect a leader, reconcile on every change and periodically, serve HTTP.

- Consumes: the pods of the served namespaces and of gpushare's own (API server
  watches), the leader lease.
- Publishes: nothing on NATS; ShadowPods, created and retired while it leads;
  the lease, given up on exit so a standby takes over without waiting.
- Runs: one watch per namespace, leader, reconcile; HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from gpushare_common.adapters.kube import Kube
from gpushare_common.logging import get_logger
from gpushare_common.retry import wait_any
from gpushare_common.service import ServiceBase

from .controller import Controller
from .leader import LeaderElector
from .settings import Settings
from .status import ShadowControllerStatus

SERVICE = "shadow-controller"
log = get_logger(SERVICE)


class Service(ServiceBase):
    """The cluster's ShadowPod controller (one replica leads); ``kube``: the API client (tests pass
    their own)."""

    status_model = ShadowControllerStatus

    def __init__(self, settings: Settings, kube: Kube | None = None, stop: asyncio.Event | None = None) -> None:
        super().__init__(SERVICE, settings.http, "watch", stop=stop)
        self.settings = settings
        self.kube = kube or Kube(settings.kube)
        self.skeleton.on_exit(self.kube.close)  # last: the lease is released through it first
        self.leader = LeaderElector(
            self.kube, settings.shadow.lease_namespace, settings.shadow.lease_name,
            settings.shadow.who(), settings.shadow.lease_duration_s, settings.shadow.renew_every_s)
        self.controller = Controller(self.kube, settings.shadow, self.registry, lambda: self.leader.is_leader,
                                     system_namespace=settings.kube.system_namespace)

    async def _watch(self, stop: asyncio.Event, namespace: str | None) -> None:
        async for change in self.kube.watch_pods(stop, namespace=namespace):
            self.controller.apply(change, namespace)
            if change.kind == "SYNC":
                self.health.set("watch", True)

    async def _reconcile_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await wait_any(self.controller.dirty, self.leader.changed, timeout=self.settings.shadow.resync_s)
            self.controller.dirty.clear()
            self.leader.changed.clear()
            if self.leader.is_leader and self.health.ready:
                await self.controller.reconcile()

    async def start(self) -> None:
        svc, stop = self.skeleton, self.skeleton.stop
        served = self.settings.shadow.namespaces  # the tenants served, and the ShadowPods' own namespace
        namespaces: list[str | None] = list(dict.fromkeys([*served, self.settings.kube.system_namespace])) \
            if served else [None]
        for namespace in namespaces:
            svc.spawn(f"watch-{namespace or 'all'}", self._watch(stop, namespace))
        svc.spawn("leader", self.leader.run(stop))
        svc.spawn("reconcile", self._reconcile_loop(stop))
        svc.on_exit(self.leader.release)  # once the loops are cancelled

    def status(self) -> Mapping[str, object]:
        return {"identity": self.leader.identity, **self.controller.status()}
