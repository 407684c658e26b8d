"""The order the solver sees a device handed over in: a release before the next use, even when
NATS makes the release's publish wait (a failover) and the use's passes at once."""

from __future__ import annotations

import asyncio

from gpushare_common import events as ev
from gpushare_common.subjects import Subjects

from tests.detector.harness import NODE, build


class SlowForReleases:
    """The bus at our adapter boundary: a ``cleared`` event is stored only after a retry (50 ms),
    anything else at once; what the stream holds, in its order."""

    subjects = Subjects()

    def __init__(self) -> None:
        self.stored: list[ev.Event] = []

    async def publish_reliably(self, subject: str, event: ev.Event, stop: asyncio.Event | None = None,
                               deadline_s: float | None = None) -> int:
        if getattr(event, "state", "") == "cleared":
            await asyncio.sleep(0.05)
        self.stored.append(event)
        return len(self.stored)


async def test_a_release_reaches_the_stream_before_the_use_that_follows_it() -> None:
    bus = SlowForReleases()
    detector = build(bus, "/nonexistent.sock")  # type: ignore[arg-type]
    gone = ev.SpotEvent(node=NODE, pod="spot/old", container="main", state="cleared", devices=("spot-GPU-3",))
    new = ev.SpotEvent(node=NODE, pod="spot/new", container="main", state="using", devices=("spot-GPU-3",))
    other = ev.ShareEvent(node=NODE, share_pod="ml/s", container="c", resource="share-gpu-2", state="using",
                          devices=("gs/shadow-0",))
    await detector.publish([new, other, gone])  # a re-list yields them in any order
    assert bus.stored.index(gone) < bus.stored.index(new)
    assert {type(e) for e in bus.stored} == {ev.SpotEvent, ev.ShareEvent} and len(bus.stored) == 3
    await detector.devices.close()  # type: ignore[attr-defined]
