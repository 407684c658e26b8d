"""The solver's outgoing side on NATS: publish, publish once (JetStream), kmod request/reply."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from gpushare_common.bus import Bus, BusError
from gpushare_common.events import Event, EventDecodeError, KmodCommand, KmodReply, decode, encode


class BusOutbox:
    def __init__(self, bus: Bus, node: str, kmod_timeout_s: float) -> None:
        self.bus, self.node, self.timeout = bus, node, kmod_timeout_s

    async def publish(self, subject: str, event: Event) -> None:
        await self.bus.publish(subject, event)

    async def publish_once(self, subject: str, event: Event) -> None:
        await self.bus.publish_persistent(subject, event)

    async def kmod(self, command: KmodCommand) -> KmodReply:
        """Request/reply on the kmod subject. The subject lies inside the JetStream stream, so the
        stream's publish ack arrives on the same inbox as the bridge's reply: skip anything that
        is not a :class:`KmodReply`."""
        subject = self.bus.subjects.kmod_cmd(self.node)
        nc = self.bus.nc
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        try:
            await nc.publish(subject, encode(command), reply=inbox)
            return await _first_reply(sub, self.timeout, subject)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


async def _first_reply(sub: Any, timeout: float, subject: str) -> KmodReply:
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            msg = await sub.next_msg(timeout=left)
        except Exception:
            break
        with contextlib.suppress(EventDecodeError):
            reply = decode(msg.data)
            if isinstance(reply, KmodReply):
                return reply
    raise BusError(f"no kmod reply on {subject} within {timeout}s: is the kmod-bridge running?")
