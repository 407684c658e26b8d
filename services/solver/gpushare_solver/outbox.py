"""The solver's outgoing side on NATS: publish, publish once (JetStream), kmod and fence requests."""

from __future__ import annotations

from gpushare_common.bus import Bus, Permanent
from gpushare_common.events import DeviceHealth, Event, HealthApplied, KmodCommand, KmodReply, event_tag


class BusOutbox:
    def __init__(self, bus: Bus, node: str, kmod_timeout_s: float, fence_timeout_s: float = 0.5) -> None:
        self.bus, self.node, self.timeout, self.fence_timeout = bus, node, kmod_timeout_s, fence_timeout_s

    async def publish(self, subject: str, event: Event) -> None:
        await self.bus.publish(subject, event)

    async def publish_once(self, subject: str, event: Event) -> None:
        await self.bus.publish_persistent(subject, event)

    async def kmod(self, command: KmodCommand) -> KmodReply:
        subject = self.bus.subjects.kmod_requests(self.node, "solver")
        reply = await self.bus.request(subject, command, self.timeout)
        if not isinstance(reply, KmodReply):
            raise Permanent(f"request {subject}", f"expected a kmod_reply, got {event_tag(reply)}")
        return reply

    async def fence(self, health: DeviceHealth) -> HealthApplied:
        subject = self.bus.subjects.fence(self.node, health.resource)
        reply = await self.bus.request(subject, health, self.fence_timeout)
        if not isinstance(reply, HealthApplied):
            raise Permanent(f"request {subject}", f"expected a health_applied, got {event_tag(reply)}")
        return reply
