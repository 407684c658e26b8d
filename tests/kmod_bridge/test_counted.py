"""Sharers and borrowers are counted only: the bridge wired to the kernel stand-in, and the
detector's sync to the bridge service over a real nats-server."""

from __future__ import annotations

import errno
import json

from gpushare_common import events
from gpushare_common.settings import NatsSettings
from gpushare_detector.kmod import KmodSync
from gpushare_detector.metrics import DetectorMetrics
from gpushare_kmod_bridge.resolver import ContainerProcs
from gpushare_sim.kernel import KernelStandIn
from prometheus_client import CollectorRegistry

from tests.support.http import get_ok

from .conftest import Namespaces, ioctl, wait_until
from .test_bridge import NODE, Containers, pod_cmd, wired
from .test_service import NODE as SERVICE_NODE
from .test_service import FixedSource, bridge, bridge_settings, client, command

SHADOW = "gpushare-system/shadow-1"
PLACED = (events.Placement(container="team-a/dev-1/main", cards=("GPU-0",)),
          events.Placement(container="team-b/infer/main", role="sharer", cards=("GPU-1",), shadow=SHADOW),
          events.Placement(container="team-c/job/main", role="borrower", cards=("GPU-0",)))


async def test_a_sharer_or_borrower_is_counted_and_never_detected_held_or_an_owner_back(
        kernel: KernelStandIn, namespaces: Namespaces) -> None:
    source, owner, sharer, borrower = Containers(), namespaces.new(), namespaces.new(), namespaces.new()
    for cid, pod, process in (("c1", "team-a/dev-1", owner), ("c2", "team-b/infer", sharer),
                              ("c3", "team-c/job", borrower)):
        source.run(cid, pod, process)
    async with wired(kernel, source) as (bridge_, published, store):
        added = await bridge_.serve_command(events.KmodCommand(
            node=NODE, op="add", pods=tuple(p.container for p in PLACED), placements=PLACED))
        assert isinstance(added, events.KmodReply) and added.status == 0
        assert bridge_.watchset.get(sharer.pidns).shadow == SHADOW  # type: ignore[union-attr]
        for pod in ("team-b/infer", "team-c/job"):
            for op in ("detect", "hold"):
                refused = await pod_cmd(bridge_, op, pod)
                assert refused.status == -errno.EPERM and "counted only" in refused.message, (op, pod)
        assert (await pod_cmd(bridge_, "detect", "team-a/dev-1")).status == 0  # the owner: detectable
        for process in (sharer, borrower):
            for _ in range(3):
                await ioctl(kernel.hook_path, process.pidns, pid=process.pid)
        assert [kernel.state.entries[p.pidns].notices for p in (sharer, borrower)] == [0, 0]
        assert published.events.empty()
        named = await bridge_.serve_command(events.KmodCommand(node=NODE, op="stats", pids=(sharer.pid, 10**9)))
        assert isinstance(named, events.KmodReply)
        assert named.processes == (events.ProcessOwner(pid=sharer.pid, pidns=sharer.pidns, pod="team-b/infer",
                                                       container="main"),)
        stats = await pod_cmd(bridge_, "stats")
        assert sorted((s.pod, s.container, s.role, s.hits) for s in stats.stats) == [
            ("team-a/dev-1", "main", "owner", 0), ("team-b/infer", "main", "sharer", 3),
            ("team-c/job", "main", "borrower", 3)]
        kernel.state.entries[sharer.pidns].need_notice = True  # armed before it was placed (never by the bridge)
        call = await ioctl(kernel.hook_path, sharer.pidns, pid=sharer.pid)
        assert call < kernel.state.timeout_ms and published.events.empty()  # released, no owner-back
        assert bridge_.metrics.errors.labels("counted-only-notice")._value.get() == 1
        assert sorted(store.data) == sorted(str(p.pidns) for p in (owner, sharer, borrower))


async def test_the_detectors_placements_over_nats_count_every_pod_and_only_owners_as_owners(
        nats_settings: NatsSettings, kernel: KernelStandIn, namespaces: Namespaces) -> None:
    owner, sharer, borrower = namespaces.new(), namespaces.new(), namespaces.new()
    source = FixedSource(ContainerProcs("c1", (owner.pid,), "team-a/dev-1", "main"),
                         ContainerProcs("c2", (sharer.pid,), "team-b/infer", "main"),
                         ContainerProcs("c3", (borrower.pid,), "team-c/job", "main"))
    async with bridge(nats_settings, bridge_settings(kernel), source) as service, \
            client(nats_settings) as (bus, owner_backs):
        sync = KmodSync(bus, SERVICE_NODE, 2.0, DetectorMetrics(CollectorRegistry()))
        sync.want({p.container: p for p in PLACED})
        assert await sync.sync_once() and sync.status()["roles"] == {"owner": 1, "sharer": 1, "borrower": 1}
        for process, calls in ((sharer, 4), (borrower, 2)):
            for _ in range(calls):
                await ioctl(kernel.hook_path, process.pidns, pid=process.pid)
        answer = await sync.stats(tuple(p.container for p in PLACED), (sharer.pid, borrower.pid, 1))
        assert answer is not None
        stats, processes = answer
        # an exporter's per-process figures reach their pods: pid -> container; the host's init is nobody's
        assert processes == {sharer.pid: ("team-b/infer", "main"), borrower.pid: ("team-c/job", "main")}
        assert {(s.pod, s.role): s.hits for s in stats} == {
            ("team-a/dev-1", "owner"): 0, ("team-b/infer", "sharer"): 4, ("team-c/job", "borrower"): 2}
        assert (await command(bus, "detect", pods=("team-b/infer",))).status == -errno.EPERM
        await wait_until(lambda: service.link.last_stats is not None and
                         sum(r.hits for r in service.link.last_stats.stats) == 6, what="a heartbeat with the calls")
        port = await service.serve()
        metrics = (await get_ok(port, "/metrics")).decode()
        status = json.loads(await get_ok(port, "/status"))
    assert 'gpushare_kmod_gpu_calls_total{card="GPU-1",container="main",pod="team-b/infer",role="sharer",' \
        f'shadow="{SHADOW}"}} 4.0' in metrics
    assert 'gpushare_kmod_gpu_calls_total{card="GPU-0",container="main",pod="team-c/job",role="borrower",' \
        'shadow=""} 2.0' in metrics
    assert {(e["pod"], e["role"]) for e in status["watch_set"]} == {
        ("team-a/dev-1", "owner"), ("team-b/infer", "sharer"), ("team-c/job", "borrower")}
    assert owner_backs.empty()
