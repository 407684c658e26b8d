"""The bridge service against a real nats-server and the kernel stand-in."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator

from gpushare_common import events
from gpushare_common.bus import Bus
from gpushare_common.settings import (
    CommonSettings,
    HttpSettings,
    KubeSettings,
    LogSettings,
    NatsSettings,
    NodeSettings,
)
from gpushare_kmod_bridge.app import Service
from gpushare_kmod_bridge.resolver import ContainerProcs
from gpushare_kmod_bridge.settings import KmodBridgeSettings
from gpushare_sim.kernel import KernelStandIn

from tests.support.http import get_ok
from tests.support.nats import NatsServer

from .conftest import Namespaces, PidnsProcess, ioctl, wait_until

NODE = "gpu-node-1.example"


class FixedSource:
    name = "fixed"

    def __init__(self, *containers: ContainerProcs) -> None:
        self.items = list(containers)

    async def containers(self) -> list[ContainerProcs]:
        return list(self.items)


def bridge_settings(kernel: KernelStandIn) -> KmodBridgeSettings:
    return KmodBridgeSettings(transport="sim", sim_socket=kernel.socket_path, heartbeat_s=0.1,
                              reply_timeout_s=1.0, backoff_min_s=0.01, backoff_max_s=0.1,
                              sources=(), refresh_s=0.5)


@contextlib.asynccontextmanager
async def bridge(nats: NatsSettings, settings: KmodBridgeSettings,
                 source: FixedSource) -> AsyncIterator[Service]:
    common = CommonSettings(nats=nats, http=HttpSettings(host="127.0.0.1", port=0), log=LogSettings(),
                            node=NodeSettings(NODE), kube=KubeSettings())
    service = Service(common, settings, sources=[source])
    try:
        await service.start()
        await asyncio.wait_for(service.link.registered.wait(), 5)
        yield service
    finally:
        await service.close()


@contextlib.asynccontextmanager
async def client(nats: NatsSettings) -> AsyncIterator[tuple[Bus, asyncio.Queue[events.AnyEvent]]]:
    bus = Bus(nats, "test-solver")
    await bus.connect()
    received: asyncio.Queue[events.AnyEvent] = asyncio.Queue()

    async def collect(event: events.AnyEvent) -> None:
        received.put_nowait(event)

    await bus.subscribe(bus.subjects.event(NODE, "ownerback"), collect)
    try:
        yield bus, received
    finally:
        await bus.drain()


async def command(bus: Bus, op: str, role: str = "", **fields: object) -> events.KmodReply:
    """``op`` on the subject of the role that owns it, or on ``role``'s."""
    subject = bus.subjects.kmod_requests(NODE, role) if role else bus.subjects.kmod_cmd(NODE, op)
    reply = await bus.request(subject, events.KmodCommand(node=NODE, op=op, **fields))  # type: ignore[arg-type]
    assert isinstance(reply, events.KmodReply)
    return reply


async def test_owner_back_by_pod_key_then_release(
        nats_settings: NatsSettings, kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    source = FixedSource(ContainerProcs("c1", (pidns_process.pid,), "team-a/dev-1", "main"))
    async with bridge(nats_settings, bridge_settings(kernel), source), client(nats_settings) as (bus, got):
        reply = await command(bus, "detect", pods=("team-a/dev-1/main",))
        assert (reply.status, reply.pidns) == (0, (pidns_process.pidns,))
        call = asyncio.create_task(ioctl(kernel.hook_path, pidns_process.pidns, pid=pidns_process.pid))
        event = await asyncio.wait_for(got.get(), 5)
        assert isinstance(event, events.OwnerBackEvent)
        assert (event.pod, event.container, event.resolved) == ("team-a/dev-1", "main", True)
        assert (event.pidns, event.pid, event.node) == (pidns_process.pidns, pidns_process.pid, NODE)
        assert 0 < event.notice_to_publish_ms < 1000 and event.kernel_ts_ns > 0
        assert not call.done()
        held = await command(bus, "hold", pods=("team-a/dev-1",))
        assert (held.status, held.timeout_ms, [s.pidns for s in held.stats]) == (1, 3000, [pidns_process.pidns])
        released = await command(bus, "release", pods=("team-a/dev-1",))
        assert released.status == 1
        assert await asyncio.wait_for(call, 5) < 3000
        stats = await command(bus, "stats", pidns=(pidns_process.pidns,))
        assert [(s.pod, s.watched, s.need_notice, s.hits) for s in stats.stats] == \
            [("team-a/dev-1", True, False, 1)]


async def test_unknown_namespace_is_published_unresolved(
        nats_settings: NatsSettings, kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    pidns = pidns_process.pidns
    anonymous = FixedSource(ContainerProcs("c1", (pidns_process.pid,)))  # a container of no known pod
    async with bridge(nats_settings, bridge_settings(kernel), anonymous) as service, \
            client(nats_settings) as (bus, got):
        assert (await command(bus, "detect", pidns=(pidns,))).status == 0
        call = asyncio.create_task(ioctl(kernel.hook_path, pidns))
        event = await asyncio.wait_for(got.get(), 5)
        assert isinstance(event, events.OwnerBackEvent)
        assert (event.pidns, event.resolved, event.pod) == (pidns, False, "")
        await command(bus, "release", pidns=(pidns,))
        await call
        assert service.bridge.watchset.get(pidns).mode == "watched"  # need_notice was spent


async def test_bad_commands_get_clear_replies(
        nats_settings: NatsSettings, kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    async with bridge(nats_settings, bridge_settings(kernel), FixedSource()), \
            client(nats_settings) as (bus, _):
        assert (await command(bus, "add", pods=("no-slash",))).status == -22
        missing = await command(bus, "detect", pods=("team-b/absent",))
        assert missing.status == -2 and "team-b/absent" in missing.message
        assert (await command(bus, "config", role="solver")).status == -1  # nobody's to request: EPERM
        assert (await command(bus, "add", pidns=(0,))).status == -22
        unknown = await command(bus, "add", pidns=(pidns_process.pidns,))  # no container listed lives there
        assert unknown.status == -3 and "no such process" in unknown.message
        assert kernel.state.entries == {}


async def test_watch_set_survives_bridge_restart_and_module_reload(
        nats_settings: NatsSettings, kernel: KernelStandIn, namespaces: Namespaces,
        sock_dir) -> None:  # type: ignore[no-untyped-def]
    settings = bridge_settings(kernel)
    first, second, third = namespaces.new(), namespaces.new(), namespaces.new()
    source = FixedSource(*(ContainerProcs(f"c{i}", (p.pid,)) for i, p in enumerate((first, second, third))))
    async with bridge(nats_settings, settings, source), client(nats_settings) as (bus, _):
        assert (await command(bus, "add", pidns=(first.pidns, second.pidns))).status == 0
        assert (await command(bus, "detect", pidns=(third.pidns,))).status == 0
        await kernel.close()
        fresh = KernelStandIn(kernel.socket_path, kernel.hook_path)  # reloaded module: empty map
        await fresh.start()
        try:
            await wait_until(lambda: len(fresh.state.entries) == 3, what="watch set re-sent after reload")
            assert fresh.state.entries[third.pidns].need_notice
            assert not fresh.state.entries[first.pidns].need_notice
        finally:
            await fresh.close()
    again = KernelStandIn(str(sock_dir / "k2.sock"), str(sock_dir / "h2.sock"))
    await again.start()
    try:
        async with bridge(nats_settings, dataclasses.replace(settings, sim_socket=again.socket_path),
                          source) as restarted:
            assert sorted(again.state.entries) == sorted([first.pidns, second.pidns, third.pidns])
            assert again.state.entries[third.pidns].need_notice
            assert restarted.health.ready
    finally:
        await again.close()


async def test_status_and_metrics_over_http(
        nats_settings: NatsSettings, kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    pidns = pidns_process.pidns
    source = FixedSource(ContainerProcs("c1", (pidns_process.pid,)))
    async with bridge(nats_settings, bridge_settings(kernel), source) as service, \
            client(nats_settings) as (bus, got):
        await command(bus, "detect", pidns=(pidns,))
        call = asyncio.create_task(ioctl(kernel.hook_path, pidns))
        await asyncio.wait_for(got.get(), 5)
        await command(bus, "release", pidns=(pidns,))
        await call
        await wait_until(lambda: service.link.last_stats is not None and
                         any(r.pidns == pidns and r.releases for r in service.link.last_stats.stats),
                         what="a heartbeat after the release")
        port = await service.serve()  # stopped with the service
        status = json.loads(await get_ok(port, "/status"))
        metrics = (await get_ok(port, "/metrics")).decode()
        ready = await get_ok(port, "/readyz")
    assert status["registered"] is True and status["transport"].startswith("sim:")
    assert status["watch_set"] == [{"pidns": pidns, "mode": "watched", "pod": "", "container": "",
                                    "container_id": "", "role": "", "cards": [], "shadow": ""}]
    assert (status["kernel"]["timeout_ms"], status["kernel"]["max_hold_ms"]) == (3000, 30000)
    (entry,) = status["kernel"]["namespaces"]
    assert (entry["pidns"], entry["flags"], entry["releases"], entry["holds"]) == (pidns, ["watched"], 1, 0)
    assert "gpushare_kmod_notices_total 1.0" in metrics
    assert 'gpushare_kmod_ownerback_published_total{resolved="false"} 1.0' in metrics
    assert "gpushare_kmod_notice_to_publish_seconds_count 1.0" in metrics
    assert json.loads(ready)["ready"] is True


async def test_a_bridge_started_while_nats_is_away_holds_the_owner_until_the_solver_answers(
        subject_prefix: str, kernel: KernelStandIn, pidns_process: PidnsProcess) -> None:
    """The kmod-bridge starts again during an owner-back while no NATS server answers (an outage
    of the cluster): it registers with the kernel at once, takes the notice the kernel sends again
    and holds the owner; once NATS is back the owner-back goes out and the solver's release ends
    the hold. A bridge that read its watch set from NATS before it registered held nobody: the
    kernel let the owner go at ``timeout_ms``, beside borrowers nobody had killed yet."""
    kernel.state.timeout_ms = 1000
    assert kernel.state.add(pidns_process.pidns, pidns_process.pid, detect=True) == 0  # the last bridge's DETECT
    call = asyncio.create_task(ioctl(kernel.hook_path, pidns_process.pidns, pid=pidns_process.pid))
    await wait_until(lambda: kernel.dropped == 1, what="the notice, dropped: no bridge registered")
    server = await asyncio.to_thread(NatsServer().start)  # its port, bound once; stopped: NATS is away
    await asyncio.to_thread(server.stop)
    nats = NatsSettings(url=server.url, prefix=f"{subject_prefix}.v1", stream=subject_prefix.upper(),
                        kv_prefix=subject_prefix, reconnect_wait_s=0.05, connect_timeout_s=0.5, ensure_layout=True)
    common = CommonSettings(nats=nats, http=HttpSettings(host="127.0.0.1", port=0), log=LogSettings(),
                            node=NodeSettings(NODE), kube=KubeSettings())
    source = FixedSource(ContainerProcs("c1", (pidns_process.pid,), "team-a/dev-1", "main"))
    service = Service(common, bridge_settings(kernel), sources=[source])
    starting = asyncio.create_task(service.start())
    try:
        await wait_until(lambda: service.bridge.status()["holding"] == [pidns_process.pidns], what="the hold")
        holds = service.registry
        await wait_until(lambda: (holds.get_sample_value("gpushare_kmod_bridge_holds_total") or 0) >= 7,
                         what="seven holds: more than two kernel timeouts")
        assert not call.done() and not service.health.report()["components"]["nats"]["ready"]
        await asyncio.to_thread(server.start)
        await asyncio.wait_for(starting, 10)
        async with client(nats) as (bus, _):
            await wait_until_async(lambda: owner_backs(bus), 10, "the owner-back in the stream")
            assert (await command(bus, "release", pods=("team-a/dev-1",))).status == 1
        assert await asyncio.wait_for(call, 5) >= 2000
        assert service.bridge.status()["holding"] == []
    finally:
        starting.cancel()
        await service.close()
        await asyncio.to_thread(server.cleanup)


async def owner_backs(bus: Bus) -> list[events.AnyEvent]:
    return [m.event() for m in await bus.read_after(bus.subjects.event(NODE, "ownerback"), 0)]


async def wait_until_async(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)
