"""A durable consumer kept as declared: checked when bound and every ``check_s``, healed when not.

A consumer's configuration can be changed by anyone allowed to create it (a create of an
existing name is an update): narrowed to another filter, it skips every message of its own
subject, and putting the filter back does not bring them back (its position moved on). The
consumer that reads them checks what it declared (filter, acks, redelivery) when it binds and
every ``check_s``. While they agree it remembers the ack floor (every message up to it is
handled). When they do not, it logs, counts (``gpushare_bus_consumer_restored``) and makes the
consumer again from the last floor it saw intact: everything after it is delivered again, so
nothing skipped meanwhile is lost; what was handled already comes again as a duplicate, which
the handler's idempotence drops. A consumer found changed when its reader starts is made again
from its own floor, which may already lie past what it skipped (the detector's periodic
republication brings those facts back; an owner-back is not republished).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nats.js import api
from nats.js.errors import NotFoundError

from ..logging import get_logger
from .connection import Bus

log = get_logger("bus.durable")
_CHECKED = ("filter_subject", "ack_policy", "max_deliver", "ack_wait")


@dataclass
class Durable:
    """One durable pull consumer of the bus's stream, as its reader declares it."""

    bus: Bus
    subject: str
    name: str
    ack_wait_s: float
    floor: int | None = None  # the ack floor last seen with the declared configuration (None: never)

    def declared(self, start_seq: int = 0) -> api.ConsumerConfig:
        policy = api.DeliverPolicy.BY_START_SEQUENCE if start_seq else api.DeliverPolicy.ALL
        return api.ConsumerConfig(name=self.name, durable_name=self.name, ack_policy=api.AckPolicy.EXPLICIT,
                                  max_deliver=-1, ack_wait=self.ack_wait_s, deliver_policy=policy,
                                  opt_start_seq=start_seq or None, filter_subject=self.subject)

    async def bind(self) -> Any:
        """Check (and heal) the consumer, then a pull subscription bound to it."""
        await self.check()
        return await self.bus.client.jetstream().pull_subscribe_bind(durable=self.name,
                                                                     stream=self.bus.settings.stream)

    async def check(self) -> bool:
        """True when the consumer was healed (made again from the last intact floor)."""
        jsm = self.bus.client.jetstream()._jsm
        stream = self.bus.settings.stream
        try:
            info = await jsm.consumer_info(stream, self.name)
        except NotFoundError:
            await jsm.add_consumer(stream, self.declared())
            return False
        floor = int(info.ack_floor.stream_seq) if info.ack_floor else 0
        changed = tampered(info.config, self.declared())
        if not changed:
            self.floor = max(self.floor or 0, floor)
            return False
        if self.floor is None:  # never seen intact (found so at start): its own floor, the best there is
            self.floor = floor
        await self._heal(changed, self.floor)
        return True

    async def _heal(self, changed: dict[str, tuple[object, object]], floor: int) -> None:
        jsm, stream = self.bus.client.jetstream()._jsm, self.bus.settings.stream
        self.bus.metrics.restored.labels(self.name).inc()
        log.error("durable consumer changed behind its reader: made again, what it skipped is delivered again",
                  service=self.bus.service, durable=self.name, from_seq=floor + 1,
                  changed=", ".join(f"{k}={v[0]!r} (declared {v[1]!r})" for k, v in sorted(changed.items())))
        try:
            await jsm.delete_consumer(stream, self.name)
        except NotFoundError:
            pass
        await jsm.add_consumer(stream, self.declared(floor + 1 if floor else 0))


def tampered(found: api.ConsumerConfig, declared: api.ConsumerConfig) -> dict[str, tuple[object, object]]:
    """The fields of ``found`` that differ from what was declared (name -> (found, declared))."""
    return {name: (getattr(found, name), getattr(declared, name)) for name in _CHECKED
            if getattr(found, name) != getattr(declared, name)}
