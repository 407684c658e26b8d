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
from gpushare_kmod_bridge.resolver import ContainerProcs, Owner, Resolver, Snapshot
from gpushare_kmod_bridge.watchset import MemoryStore, WatchEntry, WatchSet
from gpushare_sim.kernel import KernelStandIn
from hypothesis import given
from hypothesis import strategies as st

from .conftest import ioctl

NODE = "n1"
FAST = LinkSettings(reply_timeout_s=0.5, heartbeat_s=0.05, backoff_min_s=0.01, backoff_max_s=0.05)


def test_owner_is_the_container_living_in_the_namespace_else_the_command() -> None:
    entry = WatchEntry(pidns=5, pod="ns/a", container="main")
    assert handlers.owner_of(entry, Owner("ns/b", "side")) == ("ns/b", "side")
    assert handlers.owner_of(entry, None) == ("ns/a", "main")
    assert handlers.owner_of(WatchEntry(pidns=5), Owner("ns/b", "side")) == ("ns/b", "side")
    assert handlers.owner_of(None, None) == ("", "")


def test_an_entry_is_stale_when_another_container_has_its_namespace_or_its_container_is_gone() -> None:
    bound = WatchEntry(pidns=5, pod="ns/a", container="main", container_id="c1")
    listing = Snapshot({5: Owner("ns/a", "main", "c1")}, complete=True)
    assert not handlers.is_stale(bound, Owner("ns/a", "main", "c1"), listing)
    assert handlers.is_stale(bound, Owner("ns/b", "main", "c2"), listing)  # the inode was reused
    assert handlers.is_stale(bound, None, Snapshot({}, complete=True))  # its container is gone
    assert not handlers.is_stale(bound, None, Snapshot({}, complete=False))  # a source failed: unsure
    assert not handlers.is_stale(WatchEntry(pidns=5, pod="ns/a"), Owner("ns/b", "x", "c2"), listing)
    assert not handlers.is_stale(None, Owner("ns/b", "x", "c2"), listing)


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


class Containers:
    """The node's containers as a container source and /proc report them; ``spawn`` starts
    another process in a container after the listing."""

    name = "test"

    def __init__(self) -> None:
        self.now: list[ContainerProcs] = []
        self.procs: dict[int, str] = {}  # pid -> container id (its cgroup)
        self.namespaces: dict[str, int] = {}  # container id -> pid namespace
        self.next_pid = 1000

    async def containers(self) -> list[ContainerProcs]:
        return list(self.now)

    def cgroup_of(self, pid: int) -> str | None:
        cid = self.procs.get(pid)
        return None if cid is None else f"0::/kubepods/{cid}\n"

    def pidns_of(self, pid: int) -> int | None:
        cid = self.procs.get(pid)
        return None if cid is None else self.namespaces[cid]

    def run(self, cid: str, pod: str, pidns: int) -> None:
        self.stop(cid)
        self.namespaces[cid] = pidns
        pid = self.spawn(cid)
        self.now.append(ContainerProcs(cid, (pid,), pod, "main"))

    def spawn(self, cid: str) -> int:
        self.next_pid += 1
        self.procs[self.next_pid] = cid
        return self.next_pid

    def stop(self, cid: str) -> None:
        self.now = [c for c in self.now if c.container_id != cid]
        self.procs = {p: c for p, c in self.procs.items() if c != cid}


@contextlib.asynccontextmanager
async def wired(kernel: KernelStandIn, source: Containers | None = None,
                ) -> AsyncIterator[tuple[Bridge, Published, MemoryStore]]:  # fmt: skip
    store, published = MemoryStore(), Published()
    resolver = Resolver([source] if source else [], source.pidns_of if source else lambda pid: None, None,
                        min_refresh_s=0.0, cgroup_of=source.cgroup_of if source else lambda pid: None)
    bridge = Bridge(NODE, "p.v1.n1.event.ownerback", published, WatchSet(store), resolver, BridgeMetrics())
    resolver.on_refresh.append(bridge.prune)
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


async def pod_cmd(bridge: Bridge, op: str, *pods: str) -> events.KmodReply:
    reply = await bridge.serve_command(events.KmodCommand(node=NODE, op=op, pods=pods))  # type: ignore[arg-type]
    assert isinstance(reply, events.KmodReply)
    return reply


async def test_commands_by_pod_key_reach_a_pod_that_is_already_gone(kernel: KernelStandIn) -> None:
    source = Containers()
    async with wired(kernel, source) as (bridge, _, store):
        source.run("c1", "ns/dev", 101)
        assert (await pod_cmd(bridge, "detect", "ns/dev/main")).status == 0
        assert bridge.watchset.get(101).container_id == "c1"  # type: ignore[union-attr]
        source.stop("c1")
        bridge.resolver.snapshot = Snapshot()  # the bridge has not listed the containers since
        reply = await pod_cmd(bridge, "delete", "ns/dev/main")
        assert reply.status >= 0 and reply.pidns == (101,)
        assert bridge.watchset.entries == {} and store.data == {} and 101 not in kernel.state.entries


async def test_a_refresh_forgets_the_namespaces_of_departed_containers(kernel: KernelStandIn) -> None:
    source = Containers()
    async with wired(kernel, source) as (bridge, _, store):
        source.run("c1", "ns/dev", 101)
        source.run("c2", "ns/ml", 102)
        await pod_cmd(bridge, "detect", "ns/dev/main")
        await pod_cmd(bridge, "add", "ns/ml/main")
        source.stop("c1")
        await bridge.resolver.refresh()
        assert sorted(bridge.watchset.entries) == [102] and sorted(kernel.state.entries) == [102]
        assert list(store.data) == ["102"]
        assert bridge.metrics.stale.labels("refresh")._value.get() == 1


async def test_a_reused_namespace_never_inherits_a_stale_entry(kernel: KernelStandIn) -> None:
    """The kernel hands the inode of a departed pod's namespace to a new container before the
    bridge noticed: its first GPU call is not an owner-back and is not held past the lookup."""
    source = Containers()
    async with wired(kernel, source) as (bridge, published, _):
        source.run("c1", "old/dev", 101)
        await pod_cmd(bridge, "detect", "old/dev/main")
        source.stop("c1")
        source.run("c9", "new/job", 101)  # same inode, another container
        pid = source.spawn("c9")  # the new container's workload makes the call
        held_ms = await asyncio.wait_for(ioctl(kernel.hook_path, 101, pid=pid), 5)
        assert held_ms < 1000 and published.events.empty()
        assert bridge.watchset.entries == {} and 101 not in kernel.state.entries
        assert bridge.metrics.stale.labels("notice")._value.get() == 1


async def test_watching_a_reused_namespace_starts_afresh(kernel: KernelStandIn) -> None:
    source = Containers()
    async with wired(kernel, source) as (bridge, published, _):
        source.run("c1", "old/dev", 101)
        await pod_cmd(bridge, "detect", "old/dev/main")
        source.stop("c1")
        source.run("c9", "new/job", 101)
        await pod_cmd(bridge, "add", "new/job/main")
        entry = bridge.watchset.get(101)
        assert entry is not None and (entry.pod, entry.mode, entry.container_id) == ("new/job", "watched", "c9")
        assert not kernel.state.entries[101].need_notice  # the old DETECT did not survive
        assert await asyncio.wait_for(ioctl(kernel.hook_path, 101), 5) < 1000 and published.events.empty()


async def test_the_watched_container_coming_back_is_an_owner_back(kernel: KernelStandIn) -> None:
    source = Containers()
    async with wired(kernel, source) as (bridge, published, _):
        source.run("c1", "ns/dev", 101)
        await pod_cmd(bridge, "detect", "ns/dev/main")
        pid = source.spawn("c1")  # a process started in the owner's container since the listing
        call = asyncio.create_task(ioctl(kernel.hook_path, 101, pid=pid))
        event = await asyncio.wait_for(published.events.get(), 5)
        assert isinstance(event, events.OwnerBackEvent) and (event.pod, event.resolved) == ("ns/dev", True)
        await pod_cmd(bridge, "release", "ns/dev/main")
        assert await asyncio.wait_for(call, 5) < 3000
