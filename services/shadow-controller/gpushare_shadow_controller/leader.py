"""Leader election on a ``coordination.k8s.io/v1`` Lease.

Only the leader writes.  Leadership is valid until ``last successful renew +
lease duration`` by this process's monotonic clock; ``is_leader`` turns false
the moment that passes or a renew is refused, before anyone else can take
the lease, so a deposed leader stops writing at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from typing import Any

from gpushare_common.adapters.kube import Conflict, Kube, KubeError, NotFound
from gpushare_common.logging import get_logger
from gpushare_common.retry import wait_for_stop

log = get_logger("shadow-controller.leader")


def _now_micro() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(stamp: str | None) -> float:
    if not stamp:
        return 0.0
    try:
        return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


class LeaderElector:
    def __init__(self, kube: Kube, namespace: str, name: str, identity: str,
                 duration_s: float = 15.0, renew_every_s: float = 5.0) -> None:
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.duration_s, self.renew_every_s = duration_s, renew_every_s
        self._valid_until = 0.0
        self.transitions = 0
        self.changed = asyncio.Event()

    @property
    def is_leader(self) -> bool:
        return time.monotonic() < self._valid_until

    def _spec(self, previous: dict[str, Any] | None) -> dict[str, Any]:
        now = _now_micro()
        spec = dict(previous or {})
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if previous else 0)
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=int(self.duration_s), renewTime=now)
        return spec

    async def try_acquire_or_renew(self) -> bool:
        started = time.monotonic()
        try:
            lease = await self.kube.get_lease(self.namespace, self.name)
        except NotFound:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": self._spec(None)}
            try:
                await self.kube.create_lease(self.namespace, body)
            except Conflict:
                return self._set(False, "lost the race to create the lease")
            return self._set(True, "created the lease", started)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        expires = _parse(spec.get("renewTime")) + float(spec.get("leaseDurationSeconds") or 0)
        if holder and holder != self.identity and time.time() < expires:
            return self._set(False, f"held by {holder}")
        lease["spec"] = self._spec(spec)
        try:
            await self.kube.replace_lease(self.namespace, self.name, lease)
        except Conflict:
            return self._set(False, "lease changed under us")
        return self._set(True, "renewed" if holder == self.identity else f"took over from {holder}", started)

    def _set(self, leader: bool, reason: str, started: float = 0.0) -> bool:
        was = self.is_leader
        self._valid_until = started + self.duration_s if leader else 0.0
        if was != leader:
            self.transitions += 1
            self.changed.set()
            log.info("leadership changed", identity=self.identity, leader=leader, reason=reason)
        return leader

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.try_acquire_or_renew()
            except KubeError as err:
                log.warning("lease update failed", identity=self.identity, error=str(err))
            await wait_for_stop(stop, self.renew_every_s if self.is_leader else self.renew_every_s / 2)
        await self.release()

    async def release(self) -> None:
        """Give the lease up on shutdown so a standby takes over without waiting."""
        if not self.is_leader:
            return
        self._valid_until = 0.0
        with contextlib.suppress(KubeError):
            lease = await self.kube.get_lease(self.namespace, self.name)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["renewTime"] = None
                lease["spec"]["holderIdentity"] = None
                await self.kube.replace_lease(self.namespace, self.name, lease)
