"""Handlers directly, and the bridge wired in memory (watch set, publisher) to the kernel stand-in."""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import AsyncIterator

from gpushare_common import events
from gpushare_kmod_bridge import handlers, protocol
from gpushare_kmod_bridge.adapters.simsocket import SimTransport
from gpushare_kmod_bridge.bridge import Bridge
from gpushare_kmod_bridge.link import KernelLink, LinkSettings
from gpushare_kmod_bridge.metrics import BridgeMetrics
from gpushare_kmod_bridge.resolver import Owner, Resolver
from gpushare_kmod_bridge.watchset import MemoryStore, WatchEntry, WatchSet
from gpushare_sim.kernel import KernelStandIn
from hypothesis import given
from hypothesis import strategies as st

from .conftest import ioctl

NODE = "n1"
FAST = LinkSettings(reply_timeout_s=0.5, heartbeat_s=0.05, backoff_min_s=0.01, backoff_max_s=0.05)


def test_owner_prefers_the_command_that_named_the_namespace() -> None:
    entry = WatchEntry(pidns=5, pod="ns/a", container="main")
    assert handlers.owner_of(entry, Owner("ns/b", "side")) == ("ns/a", "main")
    assert handlers.owner_of(WatchEntry(pidns=5), Owner("ns/b", "side")) == ("ns/b", "side")
    assert handlers.owner_of(None, None) == ("", "")


def test_owner_back_event_fields() -> None:
    notice = protocol.Notice(pidns=9, ts_ns=1_000_000, pid=42, tid=43, ioctl_cmd=0x4600)
    event = handlers.owner_back(NODE, notice, "ns/p", "main", publish_ns=3_500_000)
    assert (event.pidns, event.pid, event.kernel_ts_ns, event.resolved) == (9, 42, 1_000_000, True)
    assert event.notice_to_publish_ms == 2.5
    assert handlers.owner_back(NODE, notice, "", "", 0).notice_to_publish_ms == 0.0


@given(st.lists(st.integers(-200, 200), max_size=10))
def test_combine_reports_the_first_error_else_the_total(statuses: list[int]) -> None:
    errors = [s for s in statuses if s < 0]
    assert handlers.combine(statuses) == (errors[0] if errors else sum(statuses))


def test_chunks_respect_the_kernel_limit() -> None:
    assert [len(c) for c in handlers.chunks(list(range(1, 2500)))] == [1024, 1024, 451]
    assert handlers.chunks([]) == [[]]


class Published:
    def __init__(self) -> None:
        self.events: asyncio.Queue[events.Event] = asyncio.Queue()

    async def __call__(self, subject: str, event: events.Event) -> None:
        assert subject == "p.v1.n1.event.ownerback"
        self.events.put_nowait(event)


@contextlib.asynccontextmanager
async def wired(kernel: KernelStandIn) -> AsyncIterator[tuple[Bridge, Published, MemoryStore]]:
    store, published = MemoryStore(), Published()
    bridge = Bridge(NODE, "p.v1.n1.event.ownerback", published, WatchSet(store),
                    Resolver([], lambda pid: None, None), BridgeMetrics())
    link = KernelLink(SimTransport(kernel.socket_path), FAST, bridge.metrics, bridge.on_notice,
                      bridge.on_registered)
    bridge.attach(link)
    stop = asyncio.Event()
    task = asyncio.create_task(link.run(stop))
    try:
        await asyncio.wait_for(link.registered.wait(), 5)
        yield bridge, published, store
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def cmd(bridge: Bridge, op: str, *ids: int) -> events.KmodReply:
    reply = await bridge.serve_command(events.KmodCommand(node=NODE, op=op, pidns=ids))  # type: ignore[arg-type]
    assert isinstance(reply, events.KmodReply)
    return reply


async def test_watch_set_follows_commands_and_notices(kernel: KernelStandIn) -> None:
    async with wired(kernel) as (bridge, published, store):
        await cmd(bridge, "detect", 7)
        await cmd(bridge, "add", 7, 8)  # add never turns a detected entry back
        assert {p: e.mode for p, e in bridge.watchset.entries.items()} == {7: "detected", 8: "watched"}
        call = asyncio.create_task(ioctl(kernel.hook_path, 7))
        event = await asyncio.wait_for(published.events.get(), 5)
        assert isinstance(event, events.OwnerBackEvent) and not event.resolved
        assert bridge.watchset.get(7).mode == "watched"  # type: ignore[union-attr]
        assert (await cmd(bridge, "release", 7)).status == 1
        await call
        await cmd(bridge, "delete", 8)
        assert sorted(store.data) == ["7"] and sorted(kernel.state.entries) == [7]


async def test_commands_while_the_kernel_is_away_are_kept_for_later(kernel: KernelStandIn) -> None:
    async with wired(kernel) as (bridge, _, _store):
        await kernel.close()
        link = bridge.link
        assert link is not None
        await asyncio.wait_for(_until(lambda: not link.registered.is_set()), 5)
        reply = await cmd(bridge, "detect", 11)
        assert reply.status == -errno.ENOTCONN and "unavailable" in reply.message
        await kernel.start()
        await asyncio.wait_for(_until(lambda: 11 in kernel.state.entries), 5)
        assert kernel.state.entries[11].need_notice


async def test_stats_reply_names_the_pods(kernel: KernelStandIn) -> None:
    async with wired(kernel) as (bridge, _, _store):
        await bridge.watchset.put(WatchEntry(pidns=21, mode="watched", pod="ns/p", container="main"))
        await cmd(bridge, "add", 21)
        reply = await cmd(bridge, "stats")
        assert [(s.pidns, s.pod, s.watched) for s in reply.stats] == [(21, "ns/p", True)]
        assert reply.kernel_now_ns > 0
        assert (await bridge.serve_command(events.SpotEvent(node=NODE, pod="a/b", container="c",
                                                            state="using"))).status == -errno.EINVAL


async def _until(predicate) -> None:  # type: ignore[no-untyped-def]
    while not predicate():
        await asyncio.sleep(0.005)
