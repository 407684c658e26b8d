"""Lifecycle: watch pods, elect a leader, reconcile on every change and periodically, serve HTTP."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from gpushare_common.adapters.kube import Kube
from gpushare_common.http import Health, build_app, serve
from gpushare_common.logging import get_logger
from gpushare_common.settings import HttpSettings, KubeSettings
from gpushare_common.tasks import Tasks, wait_first
from prometheus_client import CollectorRegistry

from .controller import Controller
from .leader import LeaderElector
from .settings import ShadowSettings

log = get_logger("shadow-controller")


@dataclass(frozen=True, slots=True)
class AppSettings:
    shadow: ShadowSettings
    kube: KubeSettings
    http: HttpSettings


class ShadowControllerApp:
    def __init__(self, settings: AppSettings, kube: Kube | None = None) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        self.kube = kube or Kube(settings.kube)
        self.health = Health("watch")
        self.leader = LeaderElector(
            self.kube, settings.shadow.lease_namespace, settings.shadow.lease_name,
            settings.shadow.who(), settings.shadow.lease_duration_s, settings.shadow.renew_every_s)
        self.controller = Controller(self.kube, settings.shadow, self.registry, lambda: self.leader.is_leader,
                                     system_namespace=settings.kube.system_namespace)
        self.tasks = Tasks("shadow-controller")

    async def _watch(self, stop: asyncio.Event, namespace: str | None) -> None:
        async for change in self.kube.watch_pods(stop, namespace=namespace):
            self.controller.apply(change, namespace)
            if change.kind == "SYNC":
                self.health.set("watch", True)

    async def _reconcile_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                waiters = [self.controller.dirty.wait(), self.leader.changed.wait()]
                await asyncio.wait_for(_first(waiters), self.settings.shadow.resync_s)
            self.controller.dirty.clear()
            self.leader.changed.clear()
            if self.leader.is_leader and self.health.ready:
                await self.controller.reconcile()

    def start(self, stop: asyncio.Event) -> None:
        self.tasks = Tasks("shadow-controller", stop)
        served = self.settings.shadow.namespaces  # the tenants served, and the ShadowPods' own namespace
        namespaces: list[str | None] = list(dict.fromkeys([*served, self.settings.kube.system_namespace])) \
            if served else [None]
        for namespace in namespaces:
            self.tasks.spawn(f"watch-{namespace or 'all'}", self._watch(stop, namespace))
        self.tasks.spawn("leader", self.leader.run(stop))
        self.tasks.spawn("reconcile", self._reconcile_loop(stop))

    def status(self) -> dict[str, object]:
        return {"identity": self.leader.identity, **self.controller.status()}

    async def run(self, stop: asyncio.Event) -> int:
        app = build_app("shadow-controller", self.health, self.registry, self.status)
        async with serve(app, self.settings.http):
            self.start(stop)
            await wait_first(stop, self.tasks)
            stop.set()
            await self.tasks.cancel_all()
        return 1 if self.tasks.failure else 0


async def _first(awaitables: list) -> None:  # type: ignore[type-arg]
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
