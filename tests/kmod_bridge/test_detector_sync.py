"""The detector's watch-set sync against the real bridge (wired in memory, the kernel stand-in).

pod-resources lists a pod's devices once the kubelet allocated them, before its containers run:
a detector resync (or re-list) in that moment wants the new owner's container while the bridge
finds no pid namespace for it yet. The bridge adds what it found and names the rest; the
detector asks again for the rest, and a new owner waits for no other container's backoff.
"""

from __future__ import annotations

import asyncio

from gpushare_common import events
from gpushare_common.subjects import Subjects
from gpushare_detector.kmod import KmodSync
from gpushare_detector.metrics import DetectorMetrics
from gpushare_kmod_bridge.bridge import Bridge
from gpushare_sim.kernel import KernelStandIn
from prometheus_client import CollectorRegistry

from .conftest import Namespaces, wait_until
from .test_bridge import NODE, Containers, pod_cmd, wired


def owners(*keys: str) -> dict[str, events.Placement]:
    return {key: events.Placement(container=key, cards=("GPU-0",)) for key in keys}


class InMemory:
    """The detector's request/reply to the bridge, without NATS in between."""

    def __init__(self, bridge: Bridge) -> None:
        self.subjects = Subjects()
        self.bridge = bridge

    async def request(self, subject: str, event: events.Event, timeout: float = 2.0) -> events.AnyEvent:
        assert isinstance(event, events.KmodCommand)
        return await self.bridge.serve_command(event)


async def test_an_add_names_the_pods_it_found_no_namespace_for(kernel: KernelStandIn,
                                                               namespaces: Namespaces) -> None:
    source, busy = Containers(), namespaces.new()
    async with wired(kernel, source) as (bridge, _, _):
        source.run("c1", "ns/busy", busy)
        reply = await pod_cmd(bridge, "add", "ns/busy/main", "ns/dev/main")
        assert reply.status == 0 and reply.pidns == (busy.pidns,)
        assert reply.unresolved == ("ns/dev/main",)


async def test_an_owner_whose_container_starts_after_the_add_is_watched_without_a_resync(
        kernel: KernelStandIn, namespaces: Namespaces) -> None:
    """The step "owner idle -> spot device" once took a minute: the owner's container was taken
    as watched before it had a namespace, so its GPU calls were unknown (never idle) until the
    next resync sent everything again."""
    source, busy, dev = Containers(), namespaces.new(), namespaces.new()
    async with wired(kernel, source) as (bridge, _, _):
        source.run("c1", "ns/busy", busy)
        sync = KmodSync(InMemory(bridge), NODE, 1.0, DetectorMetrics(CollectorRegistry()))  # type: ignore[arg-type]
        stop = asyncio.Event()
        task = asyncio.create_task(sync.run(stop, backoff_s=0.05, max_backoff_s=0.2))
        try:
            sync.want(owners("ns/busy/main", "ns/dev/main"))  # a resync while dev's container is not running
            await wait_until(lambda: bridge.watchset.get(busy.pidns) is not None, 5, "busy watched")
            source.run("c2", "ns/dev", dev)  # its container starts
            await wait_until(lambda: bridge.watchset.get(dev.pidns) is not None, 5, "the owner watched")
            assert sync.sent == owners("ns/busy/main", "ns/dev/main")
        finally:
            stop.set()
            sync.changed.set()
            await asyncio.wait_for(task, 5)


async def test_a_new_owner_does_not_wait_for_another_containers_backoff(kernel: KernelStandIn,
                                                                        namespaces: Namespaces) -> None:
    source, dev = Containers(), namespaces.new()
    async with wired(kernel, source) as (bridge, _, _):
        sync = KmodSync(InMemory(bridge), NODE, 1.0, DetectorMetrics(CollectorRegistry()))  # type: ignore[arg-type]
        stop = asyncio.Event()
        task = asyncio.create_task(sync.run(stop, backoff_s=30.0, max_backoff_s=30.0))
        try:
            sync.want(owners("ns/never/main"))  # a container that never gets a namespace: retried every 30 s
            await wait_until(lambda: sync.last_error != "", 5, "the first add refused")
            source.run("c2", "ns/dev", dev)
            sync.want(owners("ns/never/main", "ns/dev/main"))
            await wait_until(lambda: bridge.watchset.get(dev.pidns) is not None, 5, "the new owner watched")
        finally:
            stop.set()
            sync.changed.set()
            await asyncio.wait_for(task, 5)
