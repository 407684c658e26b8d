"""Events on the pods whose prepared devices changed health (pure).

The kubelet writes each container's ``allocatedResourcesStatus`` from the driver's health
stream (``ResourceHealthStatus``), which ``kubectl describe`` does not print; so the driver also
tells the pods of a claim, as an Event ``kubectl describe pod`` shows, when one of the claim's
devices turns unhealthy (``DeviceUnhealthy``; a spot device its owner took back:
``SpotTakenBack``) or healthy again (``DeviceHealthy``). A device seen healthy the first time is
no news; each change is told once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpushare_common import dra
from gpushare_common.kubeevents import pod_event as pod_event_of
from gpushare_common.logging import get_logger

from .prepare import ClaimUnreadable
from .state import PreparedClaim

log = get_logger("dra.health")

UNHEALTHY, TAKEN_BACK, HEALTHY = "DeviceUnhealthy", "SpotTakenBack", "DeviceHealthy"
COMPONENT = "gpushare-dra-driver"


@dataclass(frozen=True, slots=True)
class HealthNotice:
    namespace: str
    claim: str
    device: str
    healthy: bool

    @property
    def reason(self) -> str:
        if self.healthy:
            return HEALTHY
        return TAKEN_BACK if self.device.startswith(dra.SPOT_DEVICE_PREFIX) else UNHEALTHY

    @property
    def message(self) -> str:
        where = f"{self.device} of claim {self.namespace}/{self.claim}"
        if self.healthy:
            return f"{where} is healthy again"
        if self.reason == TAKEN_BACK:
            return f"{where} was taken back: the card's owner is back, its borrowers are evicted"
        return f"{where} is unhealthy (its vendor's device plugin says so): no new claim gets it"


def changes(claims: Iterable[PreparedClaim], states: Mapping[str, bool],
            told: dict[tuple[str, str], bool]) -> list[HealthNotice]:
    """What changed since ``told`` (updated in place; claims gone are forgotten)."""
    found, seen = [], set()
    for claim in claims:
        for device in claim.devices:
            key = (claim.uid, device.device)
            seen.add(key)
            healthy = states.get(device.device, False)
            before = told.get(key)
            told[key] = healthy
            if (before is None and not healthy) or (before is not None and before != healthy):
                found.append(HealthNotice(claim.namespace, claim.name, device.device, healthy))
    for key in set(told) - seen:
        del told[key]
    return found


def pods_of(claim: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, uid) of the pods the claim is reserved for."""
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    return [(str(r.get("name", "")), str(r.get("uid", ""))) for r in reserved
            if isinstance(r, Mapping) and r.get("resource", "pods") == "pods" and r.get("name")]


def pod_event(notice: HealthNotice, pod: str, uid: str, node: str) -> dict[str, Any]:
    """A core/v1 Event on the pod, from this node's driver."""
    return pod_event_of(notice.namespace, pod, uid=uid, reason=notice.reason, message=notice.message,
                        warning=not notice.healthy, component=COMPONENT, instance=node, host=node)


class Board(Protocol):
    version: int

    async def wait_newer(self, version: int, within_s: float) -> None: ...


class EventSink(Protocol):
    async def record(self, namespace: str, body: dict[str, Any]) -> bool: ...


class HealthTeller:
    """Waits for the health board to move; tells the pods of the claims whose devices changed."""

    def __init__(self, node: str, board: Board, claims: Callable[[], Iterable[PreparedClaim]],
                 states: Callable[[], Mapping[str, bool]], read: Callable[[str, str], Awaitable[dict[str, Any]]],
                 events: EventSink) -> None:
        self.node, self.board, self.claims, self.states = node, board, claims, states
        self.read, self.events = read, events
        self.told: dict[tuple[str, str], bool] = {}  # (claim uid, device) -> the health its pods were told

    async def run(self, within_s: float) -> None:
        version = -1
        while True:
            await self.board.wait_newer(version, within_s)
            version = self.board.version
            for notice in changes(list(self.claims()), self.states(), self.told):
                await self.tell(notice)

    async def tell(self, notice: HealthNotice) -> None:
        try:
            claim = await self.read(notice.namespace, notice.claim)
        except ClaimUnreadable as err:
            log.info("claim's pods not told of its device's health", node=self.node, error=str(err))
            return
        for pod, uid in pods_of(claim):
            if await self.events.record(notice.namespace, pod_event(notice, pod, uid, self.node)):
                log.info("pod told of its device's health", node=self.node, pod=f"{notice.namespace}/{pod}",
                         device=notice.device, reason=notice.reason)


class Versioned:
    """A version bumped on every change, and a wait for the next one."""

    def __init__(self) -> None:
        self.version = 0
        self._changed = asyncio.Event()

    def bump(self) -> None:
        self.version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_newer(self, version: int, within_s: float) -> None:
        if self.version == version:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), within_s)
