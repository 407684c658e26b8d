"""Handlers directly, and the bridge wired in memory (watch set, publisher) to the kernel stand-in."""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import AsyncIterator

import msgspec
from gpushare_common import events
from gpushare_common.bus import Transient
from gpushare_kmod_bridge import handlers, protocol
from gpushare_kmod_bridge.adapters.procfs import pidns_of
from gpushare_kmod_bridge.adapters.simsocket import SimTransport
from gpushare_kmod_bridge.bridge import Bridge
from gpushare_kmod_bridge.link import KernelLink, LinkSettings
from gpushare_kmod_bridge.metrics import BridgeMetrics
from gpushare_kmod_bridge.resolver import ContainerProcs, Owner, Resolver, Snapshot
from gpushare_kmod_bridge.watchset import MemoryStore, WatchEntry, WatchSet
from gpushare_sim.kernel import KernelStandIn
from hypothesis import given
from hypothesis import strategies as st

from .conftest import Namespaces, PidnsProcess, ioctl

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


def test_one_owner_back_id_per_hit() -> None:
    first = protocol.Notice(pidns=9, ts_ns=1_000_000, pid=42, tid=43, ioctl_cmd=0x4600, seq=1)
    again = protocol.Notice(pidns=9, ts_ns=1_000_000, pid=42, tid=43, ioctl_cmd=0x4600, seq=7,
                            flags=protocol.NOTICE_F_RESENT)
    ids = {handlers.owner_back(NODE, n, "ns/p", "main", 2_000_000 + n.seq).id for n in (first, again)}
    assert ids == {handlers.owner_back_id(NODE, 9, 1_000_000)}
    assert handlers.owner_back_id(NODE, 9, 1_000_001) not in ids  # the next hit
    assert handlers.owner_back_id("n2", 9, 1_000_000) not in ids  # another node
    assert handlers.owner_back_id(NODE, 8, 1_000_000) not in ids  # another namespace


def test_a_detected_namespace_still_armed_or_reclaiming_is_only_added_again() -> None:
    entries = [WatchEntry(pidns=1), *(WatchEntry(pidns=p, mode="detected") for p in (2, 3, 4, 5))]
    kernel = {3: protocol.F_WATCHED | protocol.F_RECLAIMING, 4: protocol.F_WATCHED | protocol.F_NEED_NOTICE,
              5: protocol.F_WATCHED}  # 2: not in the kernel (a module loaded again)
    assert handlers.resend_plan(entries, kernel) == ([1, 3, 4], [2, 5])


def test_a_live_pid_of_the_namespace_is_chosen() -> None:
    snapshot = Snapshot(pids={"c1": (10, 11), "c2": (20,)})
    namespace_of = {10: 500, 11: 501, 20: 501}.get
    assert handlers.live_pid(501, ["c1", "c2"], snapshot, namespace_of) == 11
    assert handlers.live_pid(501, ["", "c2"], snapshot, namespace_of) == 20
    assert handlers.live_pid(502, ["c1", "c2"], snapshot, namespace_of) is None
    found, missing = handlers.targets([500, 502], lambda p: ["c1"], snapshot, namespace_of)
    assert (found, missing) == ([protocol.Target(500, 10)], [502])


def test_target_statuses_per_chunk() -> None:
    a, b, c = protocol.Target(1, 5), protocol.Target(2, 5), protocol.Target(3, 5)
    listed = protocol.Reply(protocol.Header(protocol.CMD_ADD, 1, -errno.ESTALE, 2), statuses=(0, -errno.ESTALE))
    refused = protocol.Reply(protocol.Header(protocol.CMD_ADD, 2, -errno.EINVAL, 0))
    assert handlers.target_statuses([[a, b], [c]], [listed, refused]) == {1: 0, 2: -errno.ESTALE, 3: -errno.EINVAL}
    assert "another pid namespace" in handlers.failures_message({2: -errno.ESTALE})


class Containers:
    """The node's containers as a container source reports them, each a real process in a pid
    namespace of its own (the kernel stand-in checks them); cgroup membership is recorded here.
    ``spawn`` starts another process in a container after the listing (a pid never listed)."""

    name = "test"

    def __init__(self) -> None:
        self.now: list[ContainerProcs] = []
        self.procs: dict[int, str] = {}  # pid -> container id (its cgroup)
        self.next_pid = 10**8

    async def containers(self) -> list[ContainerProcs]:
        return list(self.now)

    def cgroup_of(self, pid: int) -> str | None:
        cid = self.procs.get(pid)
        return None if cid is None else f"0::/kubepods/{cid}\n"

    def run(self, cid: str, pod: str, process: PidnsProcess, pid: int = 0) -> None:
        """Container ``cid`` listed with ``pid`` (default: the namespace's first process)."""
        self.stop(cid)
        pid = pid or process.pid
        self.procs[pid] = cid
        self.now.append(ContainerProcs(cid, (pid,), pod, "main" if pod else ""))

    def spawn(self, cid: str) -> int:
        self.next_pid += 1
        self.procs[self.next_pid] = cid
        return self.next_pid

    def stop(self, cid: str) -> None:
        self.now = [c for c in self.now if c.container_id != cid]
        self.procs = {p: c for p, c in self.procs.items() if c != cid}


@contextlib.asynccontextmanager
async def wired(kernel: KernelStandIn, source: Containers, store: MemoryStore | None = None,
                loaded: bool = True) -> AsyncIterator[tuple[Bridge, Published, MemoryStore]]:
    """The bridge linked to the kernel; ``loaded=False``: its watch set is not read back yet (NATS away)."""
    store, published = store or MemoryStore(), Published()
    resolver = Resolver([source], pidns_of, None, min_refresh_s=0.0, cgroup_of=source.cgroup_of)
    bridge = Bridge(NODE, "p.v1.n1.event.ownerback", published, WatchSet(), resolver, BridgeMetrics())
    if loaded:
        await bridge.watchset.load(store)
        await bridge.watch_set_loaded()
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


async def test_watch_set_follows_commands_and_notices(kernel: KernelStandIn, namespaces: Namespaces) -> None:
    source = Containers()
    first, second = namespaces.new(), namespaces.new()
    source.run("c7", "", first)
    source.run("c8", "", second)
    async with wired(kernel, source) as (bridge, published, store):
        await cmd(bridge, "detect", first.pidns)
        await cmd(bridge, "add", first.pidns, second.pidns)  # add never turns a detected entry back
        assert {p: e.mode for p, e in bridge.watchset.entries.items()} == \
            {first.pidns: "detected", second.pidns: "watched"}
        call = asyncio.create_task(ioctl(kernel.hook_path, first.pidns))
        event = await asyncio.wait_for(published.events.get(), 5)
        assert isinstance(event, events.OwnerBackEvent) and not event.resolved
        assert bridge.watchset.get(first.pidns).mode == "watched"  # type: ignore[union-attr]
        held = await cmd(bridge, "hold", first.pidns)
        assert held.status == 1 and held.timeout_ms == kernel.state.timeout_ms
        assert (await cmd(bridge, "release", first.pidns)).status == 1
        await call
        await cmd(bridge, "delete", second.pidns)
        assert sorted(store.data) == [str(first.pidns)] and sorted(kernel.state.entries) == [first.pidns]


async def test_a_namespace_without_a_live_process_is_refused_and_not_remembered(
        kernel: KernelStandIn, namespaces: Namespaces) -> None:
    source = Containers()
    live, other = namespaces.new(), namespaces.new()
    source.run("c1", "ns/a", live)
    async with wired(kernel, source) as (bridge, _, store):
        reply = await cmd(bridge, "detect", live.pidns, other.pidns)  # nobody listed lives in `other`
        assert reply.status == -errno.ESRCH and f"pid namespace {other.pidns}: no such process" in reply.message
        assert list(bridge.watchset.entries) == [live.pidns] and list(kernel.state.entries) == [live.pidns]
        assert list(store.data) == [str(live.pidns)]


async def test_commands_while_the_kernel_is_away_are_kept_for_later(
        kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    source = Containers()
    source.run("c1", "", pidns_process)
    async with wired(kernel, source) as (bridge, _, _store):
        await kernel.close()
        link = bridge.link
        assert link is not None
        await asyncio.wait_for(_until(lambda: not link.registered.is_set()), 5)
        reply = await cmd(bridge, "detect", pidns_process.pidns)
        assert reply.status == -errno.ENOTCONN and "unavailable" in reply.message
        await kernel.start()
        await asyncio.wait_for(_until(lambda: pidns_process.pidns in kernel.state.entries), 5)
        assert kernel.state.entries[pidns_process.pidns].need_notice


async def test_registration_drops_what_has_no_live_process(kernel: KernelStandIn, namespaces: Namespaces) -> None:
    source = Containers()
    staying, leaving = namespaces.new(), namespaces.new()
    source.run("c1", "ns/a", staying)
    source.run("c2", "ns/b", leaving)
    async with wired(kernel, source) as (bridge, _, store):
        await cmd(bridge, "add", staying.pidns, leaving.pidns)
        leaving.stop()  # its container still listed, its process gone
        await asyncio.wait_for(_until(leaving.gone), 5)
        kernel.state.close()  # the module reloaded: an empty map, a new registration
        kernel.receiver = None
        await asyncio.wait_for(_until(lambda: list(kernel.state.entries) == [staying.pidns]), 5)
        await asyncio.wait_for(_until(lambda: list(store.data) == [str(staying.pidns)]), 5)


async def test_stats_reply_names_the_pods(kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    source = Containers()
    source.run("c1", "ns/p", pidns_process)
    async with wired(kernel, source) as (bridge, _, _store):
        await cmd(bridge, "add", pidns_process.pidns)
        reply = await cmd(bridge, "stats")
        assert [(s.pidns, s.pod, s.watched) for s in reply.stats] == [(pidns_process.pidns, "ns/p", True)]
        assert reply.kernel_now_ns > 0 and reply.timeout_ms == 3000
        assert (await bridge.serve_command(events.SpotEvent(node=NODE, pod="a/b", container="c",
                                                            state="using"))).status == -errno.EINVAL


async def _until(predicate) -> None:  # type: ignore[no-untyped-def]
    while not predicate():
        await asyncio.sleep(0.005)


async def pod_cmd(bridge: Bridge, op: str, *pods: str) -> events.KmodReply:
    reply = await bridge.serve_command(events.KmodCommand(node=NODE, op=op, pods=pods))  # type: ignore[arg-type]
    assert isinstance(reply, events.KmodReply)
    return reply


async def test_commands_by_pod_key_reach_a_pod_that_is_already_gone(
        kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    source = Containers()
    pidns = pidns_process.pidns
    async with wired(kernel, source) as (bridge, _, store):
        source.run("c1", "ns/dev", pidns_process)
        assert (await pod_cmd(bridge, "detect", "ns/dev/main")).status == 0
        assert bridge.watchset.get(pidns).container_id == "c1"  # type: ignore[union-attr]
        source.stop("c1")
        bridge.resolver.snapshot = Snapshot()  # the bridge has not listed the containers since
        reply = await pod_cmd(bridge, "delete", "ns/dev/main")
        assert reply.status >= 0 and reply.pidns == (pidns,)
        assert bridge.watchset.entries == {} and store.data == {} and pidns not in kernel.state.entries


async def test_a_refresh_forgets_the_namespaces_of_departed_containers(
        kernel: KernelStandIn, namespaces: Namespaces) -> None:
    source = Containers()
    dev, ml = namespaces.new(), namespaces.new()
    async with wired(kernel, source) as (bridge, _, store):
        source.run("c1", "ns/dev", dev)
        source.run("c2", "ns/ml", ml)
        await pod_cmd(bridge, "detect", "ns/dev/main")
        await pod_cmd(bridge, "add", "ns/ml/main")
        source.stop("c1")
        await bridge.resolver.refresh()
        assert sorted(bridge.watchset.entries) == [ml.pidns] and sorted(kernel.state.entries) == [ml.pidns]
        assert list(store.data) == [str(ml.pidns)]
        assert bridge.metrics.stale.labels("refresh")._value.get() == 1


async def test_a_namespace_taken_over_by_another_container_never_inherits_its_entry(
        kernel: KernelStandIn, shared_namespace: PidnsProcess) -> None:
    """The listing now puts the watched namespace in another container (one the bridge did not
    watch; both had a process there): its GPU call is not an owner-back and is not held past the
    lookup."""
    source, shared = Containers(), shared_namespace
    pidns = shared.pidns
    async with wired(kernel, source) as (bridge, published, _):
        source.run("c1", "old/dev", shared)
        await pod_cmd(bridge, "detect", "old/dev/main")
        source.stop("c1")
        source.run("c9", "new/job", shared, pid=shared.second_pid)  # its workload makes the call
        held_ms = await asyncio.wait_for(ioctl(kernel.hook_path, pidns, pid=shared.second_pid), 5)
        assert held_ms < 1000 and published.events.empty()
        assert bridge.watchset.entries == {} and pidns not in kernel.state.entries
        assert bridge.metrics.stale.labels("notice")._value.get() == 1


async def test_watching_a_taken_over_namespace_starts_afresh(
        kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    source = Containers()
    pidns = pidns_process.pidns
    async with wired(kernel, source) as (bridge, published, _):
        source.run("c1", "old/dev", pidns_process)
        await pod_cmd(bridge, "detect", "old/dev/main")
        source.stop("c1")
        source.run("c9", "new/job", pidns_process)
        await pod_cmd(bridge, "add", "new/job/main")
        entry = bridge.watchset.get(pidns)
        assert entry is not None and (entry.pod, entry.mode, entry.container_id) == ("new/job", "watched", "c9")
        assert not kernel.state.entries[pidns].need_notice  # the old DETECT did not survive
        assert await asyncio.wait_for(ioctl(kernel.hook_path, pidns), 5) < 1000 and published.events.empty()


async def test_the_watched_container_coming_back_is_an_owner_back(
        kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    source = Containers()
    pidns = pidns_process.pidns
    async with wired(kernel, source) as (bridge, published, _):
        source.run("c1", "ns/dev", pidns_process)
        await pod_cmd(bridge, "detect", "ns/dev/main")
        pid = source.spawn("c1")  # a process started in the owner's container since the listing
        call = asyncio.create_task(ioctl(kernel.hook_path, pidns, pid=pid))
        event = await asyncio.wait_for(published.events.get(), 5)
        assert isinstance(event, events.OwnerBackEvent) and (event.pod, event.resolved) == ("ns/dev", True)
        await pod_cmd(bridge, "release", "ns/dev/main")
        assert await asyncio.wait_for(call, 5) < 3000


async def test_a_notice_missed_while_the_bridge_was_away_is_the_same_owner_back(
        kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    """The bridge sees the owner-back and goes away, the owner's call still blocked; the next
    bridge gets the notice again on registration and publishes it with the same id (the stream
    keeps one). A bridge away at the hit itself gets it the same way, and re-arms nothing."""
    source, store = Containers(), MemoryStore()
    pidns = pidns_process.pidns
    source.run("c1", "ns/dev", pidns_process)
    async with wired(kernel, source, store) as (bridge, published, _):
        await pod_cmd(bridge, "detect", "ns/dev/main")
        call = asyncio.create_task(ioctl(kernel.hook_path, pidns, pid=pidns_process.pid))
        first = await asyncio.wait_for(published.events.get(), 5)
    async with wired(kernel, source, store) as (bridge, published, _):
        again = await asyncio.wait_for(published.events.get(), 5)
        assert isinstance(first, events.OwnerBackEvent) and isinstance(again, events.OwnerBackEvent)
        assert again.id == first.id and again.kernel_ts_ns == first.kernel_ts_ns
        assert (again.pod, again.pid) == ("ns/dev", pidns_process.pid)
        await pod_cmd(bridge, "release", "ns/dev/main")
        await asyncio.wait_for(call, 5)
        await pod_cmd(bridge, "detect", "ns/dev/main")
    call = asyncio.create_task(ioctl(kernel.hook_path, pidns, pid=pidns_process.pid))  # nobody registered
    await asyncio.wait_for(_until(lambda: kernel.state.entries[pidns].blocked == 1), 5)
    async with wired(kernel, source, store) as (bridge, published, _):
        missed = await asyncio.wait_for(published.events.get(), 5)
        assert isinstance(missed, events.OwnerBackEvent) and missed.id != first.id
        assert not kernel.state.entries[pidns].need_notice  # only ADDed again: no second notice armed
        assert bridge.watchset.get(pidns).mode == "watched"  # type: ignore[union-attr]
        await pod_cmd(bridge, "release", "ns/dev/main")
        await asyncio.wait_for(call, 5)
        assert await asyncio.wait_for(ioctl(kernel.hook_path, pidns), 5) < 1000 and published.events.empty()


class RefusingStore(MemoryStore):
    """The watch-set bucket while its stream has no leader: every write times out."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    async def put(self, key: str, value: object) -> int:
        if self.down:
            raise Transient(f"put {key}", "nats: no response from stream")
        return await super().put(key, value)

    async def delete(self, key: str) -> None:
        if self.down:
            raise Transient(f"delete {key}", "nats: no response from stream")
        await super().delete(key)


async def test_a_bucket_that_refuses_writes_never_stops_an_owner_back(
        kernel: KernelStandIn, namespaces: Namespaces) -> None:
    """A notice arrives while the watch-set bucket refuses writes (a NATS server of the cluster
    restarting): the owner-back is published, the kernel link keeps running, and the bucket
    gets the entry's new mode once it answers again."""
    source, store = Containers(), RefusingStore()
    owner = namespaces.new()
    source.run("c1", "ns/dev", owner)
    async with wired(kernel, source, store) as (bridge, published, _):
        await pod_cmd(bridge, "detect", "ns/dev/main")
        store.down = True
        call = asyncio.create_task(ioctl(kernel.hook_path, owner.pidns, pid=owner.pid))
        event = await asyncio.wait_for(published.events.get(), 5)
        assert isinstance(event, events.OwnerBackEvent) and event.pod == "ns/dev"
        assert bridge.watchset.get(owner.pidns).mode == "watched"  # type: ignore[union-attr]
        assert bridge.watchset.unsaved == {owner.pidns}
        assert bridge.link is not None and bridge.link.registered.is_set()  # the link did not crash
        assert (await pod_cmd(bridge, "release", "ns/dev/main")).status == 1
        await asyncio.wait_for(call, 5)
        store.down = False
        assert await bridge.watchset.flush() == 0
        assert msgspec.json.decode(store.data[str(owner.pidns)], type=WatchEntry).mode == "watched"


def _holds(bridge: Bridge) -> float:
    return bridge.metrics.registry.get_sample_value("gpushare_kmod_bridge_holds_total") or 0.0


async def test_an_unanswered_owner_back_is_held_until_the_solver_answers(
        kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    """The solver cannot answer for several kernel timeouts (a NATS failover, a solver restart):
    the bridge holds the owner itself, and the owner's call continues only at the release."""
    kernel.state.timeout_ms = 300
    source = Containers()
    source.run("c1", "ns/dev", pidns_process)
    async with wired(kernel, source) as (bridge, published, _):
        await pod_cmd(bridge, "detect", "ns/dev/main")
        call = asyncio.create_task(ioctl(kernel.hook_path, pidns_process.pidns, pid=pidns_process.pid))
        await asyncio.wait_for(published.events.get(), 5)
        await asyncio.sleep(1.5)  # five kernel timeouts
        assert not call.done() and _holds(bridge) >= 3
        assert bridge.status()["holding"] == [pidns_process.pidns]
        assert (await pod_cmd(bridge, "release", "ns/dev/main")).status == 1
        assert await asyncio.wait_for(call, 5) >= 1500
        assert bridge.status()["holding"] == []
        holds = _holds(bridge)
        await asyncio.sleep(0.5)
        assert _holds(bridge) == holds  # the answer ended the holding


async def test_an_unanswered_owner_is_held_until_the_kernels_max_hold_and_no_longer(
        kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    """A solver that never answers costs the owner the kernel's ``max_hold_ms`` from its call, no
    more: the bridge holds every third of ``timeout_ms`` and the kernel ends it. Both come from the
    module's parameters (here written as at run time), not from a setting of the bridge."""
    kernel.state.timeout_ms, kernel.state.max_hold_ms = 300, 1200
    source = Containers()
    source.run("c1", "ns/dev", pidns_process)
    async with wired(kernel, source) as (bridge, published, _):
        await _until(lambda: bridge.link is not None and bridge.link.timing.max_hold_ms == 1200)
        await pod_cmd(bridge, "detect", "ns/dev/main")
        call = asyncio.create_task(ioctl(kernel.hook_path, pidns_process.pidns, pid=pidns_process.pid))
        await asyncio.wait_for(published.events.get(), 5)
        blocked_ms = await asyncio.wait_for(call, 5)
        assert 1200 - 20 <= blocked_ms <= 1200 + 500, blocked_ms
        assert 8 <= _holds(bridge) <= 12  # 1200 ms / (300 ms / 3), less the last that moved nothing
        exhausted = bridge.metrics.registry.get_sample_value("gpushare_kmod_bridge_holds_exhausted_total")
        assert exhausted == 1
        await _until(lambda: not bridge.status()["holding"])


async def test_a_notice_before_the_watch_set_is_read_back_leaves_its_entry_watched(
        kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    """The link registers before the bucket can be read (NATS away): a notice then has no entry
    here. Read back later, the entry (saved as detected) must not be detected again: the kernel
    cleared need_notice, and a DETECT would arm a second owner-back."""
    kernel.state.timeout_ms = 300
    source, store = Containers(), MemoryStore()
    source.run("c1", "ns/dev", pidns_process)
    entry = WatchEntry(pidns=pidns_process.pidns, mode="detected", pod="ns/dev", container="main", container_id="c1")
    await store.put(str(pidns_process.pidns), entry)
    assert kernel.state.add(pidns_process.pidns, pidns_process.pid, detect=True) == 0
    async with wired(kernel, source, store, loaded=False) as (bridge, published, _):
        assert kernel.state.entries[pidns_process.pidns].need_notice, "nothing was sent before the set is read"
        call = asyncio.create_task(ioctl(kernel.hook_path, pidns_process.pidns, pid=pidns_process.pid))
        event = await asyncio.wait_for(published.events.get(), 5)
        assert isinstance(event, events.OwnerBackEvent) and event.pod == "ns/dev"
        assert await bridge.watchset.load(store) == 1
        await bridge.watch_set_loaded()
        assert bridge.watchset.get(pidns_process.pidns).mode == "watched"  # type: ignore[union-attr]
        assert msgspec.json.decode(store.data[str(pidns_process.pidns)], type=WatchEntry).mode == "watched"
        assert (await pod_cmd(bridge, "release", "ns/dev/main")).status == 1
        await asyncio.wait_for(call, 5)
        assert not kernel.state.entries[pidns_process.pidns].need_notice, "armed for a second owner-back"


class SlowListing(Containers):
    """A container listing that waits for ``go`` once ``slow`` is set (containerd slow to answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.slow, self.listing, self.go = False, asyncio.Event(), asyncio.Event()

    async def containers(self) -> list[ContainerProcs]:
        if self.slow:
            self.listing.set()
            await self.go.wait()
        return await super().containers()


async def test_a_watch_set_read_back_while_a_notice_is_handled_is_not_detected_again(
        kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    """The notice's handling waits on the container listing; the watch set is read back meanwhile:
    its entry, saved as detected, must come out watched all the same."""
    kernel.state.timeout_ms = 1000
    source, store = SlowListing(), MemoryStore()
    entry = WatchEntry(pidns=pidns_process.pidns, mode="detected", pod="ns/dev", container="main", container_id="c1")
    await store.put(str(pidns_process.pidns), entry)
    assert kernel.state.add(pidns_process.pidns, pidns_process.pid, detect=True) == 0
    async with wired(kernel, source, store, loaded=False) as (bridge, published, _):
        source.run("c1", "ns/dev", pidns_process)  # started after the listing: the notice lists again
        source.slow = True
        call = asyncio.create_task(ioctl(kernel.hook_path, pidns_process.pidns, pid=pidns_process.pid))
        await asyncio.wait_for(source.listing.wait(), 5)
        await bridge.watchset.load(store)
        loading = asyncio.create_task(bridge.watch_set_loaded())  # sends the set once the listing is done
        await _until(lambda: bridge.loaded)
        source.go.set()
        await asyncio.wait_for(loading, 5)
        await asyncio.wait_for(published.events.get(), 5)
        await asyncio.wait_for(_until(lambda: bridge.watchset.get(pidns_process.pidns).mode == "watched"),  # type: ignore[union-attr]
                               5)
        assert (await pod_cmd(bridge, "release", "ns/dev/main")).status == 1
        await asyncio.wait_for(call, 5)
