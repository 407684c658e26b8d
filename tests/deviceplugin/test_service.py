"""The service wired to a real nats-server, a kubelet stub and a vendor plugin stub."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import os
from collections.abc import AsyncIterator

import grpc
import pytest
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
from gpushare_deviceplugin.app import Service
from gpushare_deviceplugin.settings import DevicePluginSettings

from tests.support.http import get_ok
from tests.support.nats import NatsServer

from .conftest import KEY
from .stubs import KubeletStub, VendorPluginStub

NODE = "gpu-node-1.example"
SPOT = "gpushare/spot-gpu"


def common_settings(nats: NatsSettings) -> CommonSettings:
    return CommonSettings(nats=nats, http=HttpSettings(host="127.0.0.1", port=0),
                          log=LogSettings(), node=NodeSettings(NODE), kube=KubeSettings())


@pytest.fixture
def dp_settings(settings: DevicePluginSettings) -> DevicePluginSettings:
    return dataclasses.replace(settings, watch_shadow_pods=False)


@pytest.fixture
async def vendor(plugin_dir: str) -> AsyncIterator[VendorPluginStub]:
    stub = VendorPluginStub(os.path.join(plugin_dir, "vendor-nvidia.sock"),
                            {"GPU-0": "Healthy", "GPU-1": "Healthy"})
    await stub.start()
    yield stub
    await stub.stop()


@pytest.fixture
async def bus(nats_settings: NatsSettings) -> AsyncIterator[Bus]:
    publisher = Bus(nats_settings, "test-solver")
    await publisher.connect()
    await publisher.wait_for_stream()
    yield publisher
    await publisher.drain()


@pytest.fixture
async def service(nats_settings: NatsSettings, dp_settings: DevicePluginSettings,
                  kubelet: KubeletStub) -> AsyncIterator[Service]:
    svc = Service(common_settings(nats_settings), dp_settings, KEY)
    svc.start_plugins()
    await svc.connect()
    yield svc
    await svc.close()


async def publish_health(bus: Bus, devices: dict[str, events.Health], full: bool = True) -> None:
    event = events.DeviceHealth(node=NODE, resource="spot-gpu", devices=devices, full=full)
    await bus.publish(bus.subjects.health(NODE, "spot-gpu"), event)


async def test_health_on_nats_reaches_the_kubelet(
        kubelet: KubeletStub, vendor: VendorPluginStub, service: Service, bus: Bus) -> None:
    await kubelet.wait_list(SPOT, lambda d: d == {"spot-GPU-0": "Unhealthy",
                                                  "spot-GPU-1": "Unhealthy"})
    await publish_health(bus, {"spot-GPU-0": "Healthy"})
    await kubelet.wait_list(SPOT, lambda d: d["spot-GPU-0"] == "Healthy")
    await publish_health(bus, {"spot-GPU-1": "Healthy"}, full=False)
    await kubelet.wait_list(SPOT, lambda d: set(d.values()) == {"Healthy"})
    await publish_health(bus, {}, full=True)
    await kubelet.wait_list(SPOT, lambda d: set(d.values()) == {"Unhealthy"})


async def test_vendor_plugin_late_changing_and_gone(
        plugin_dir: str, kubelet: KubeletStub, service: Service, bus: Bus) -> None:
    await kubelet.wait_list(SPOT, lambda d: d == {})
    await publish_health(bus, {"spot-GPU-0": "Healthy", "spot-GPU-9": "Healthy"})
    vendor = VendorPluginStub(os.path.join(plugin_dir, "vendor-nvidia.sock"),
                              {"GPU-0": "Healthy"})
    await vendor.start()
    try:
        await kubelet.wait_list(SPOT, lambda d: d == {"spot-GPU-0": "Healthy"})
        vendor.set_devices({"GPU-0": "Unhealthy", "GPU-9": "Healthy"})
        await kubelet.wait_list(SPOT, lambda d: d == {"spot-GPU-0": "Unhealthy",
                                                      "spot-GPU-9": "Healthy"})
    finally:
        await vendor.stop()
    await kubelet.wait_list(SPOT, lambda d: set(d.values()) == {"Unhealthy"})


async def test_desired_health_restored_from_key_value(
        nats_settings: NatsSettings, dp_settings: DevicePluginSettings, kubelet: KubeletStub,
        vendor: VendorPluginStub, bus: Bus) -> None:
    store = await bus.store("health", bus.layout.scope(NODE, "health"))
    saved = events.DeviceHealth(node=NODE, resource="spot-gpu", full=True,
                                devices={"spot-GPU-1": "Healthy"})
    await store.put("spot-gpu", saved)
    await store.put("vcpu", {"resource": 7})  # garbage: skipped, logged
    svc = Service(common_settings(nats_settings), dp_settings, KEY)
    svc.start_plugins()
    try:
        await svc.connect()
        await kubelet.wait_list(SPOT, lambda d: d == {"spot-GPU-0": "Unhealthy",
                                                      "spot-GPU-1": "Healthy"})
    finally:
        await svc.close()


async def test_spare_capacity_and_borrowers(
        kubelet: KubeletStub, vendor: VendorPluginStub, service: Service, bus: Bus) -> None:
    capacity = events.SpareCapacity(node=NODE, resource="vcpu", devices=3, unit=1000)
    await bus.publish(bus.subjects.capacity(NODE, "vcpu"), capacity)
    await kubelet.wait_list("gpushare/vcpu", lambda d: len(d) == 3)
    await publish_health(bus, {"spot-GPU-0": "Healthy", "spot-GPU-1": "Healthy"})
    await kubelet.wait_list(SPOT, lambda d: set(d.values()) == {"Healthy"})
    borrow = events.SpotEvent(node=NODE, pod="batch/job-1", container="main", state="using",
                              devices=("spot-GPU-0",))
    await bus.publish(bus.subjects.event(NODE, "spot"), borrow)
    spot = service.plugins.spot
    assert spot is not None
    async with asyncio.timeout(5):
        while not spot.borrowed():
            await asyncio.sleep(0.01)
    chosen = await kubelet.preferred(SPOT, ["spot-GPU-0", "spot-GPU-1"], [], 1)
    assert chosen == ["spot-GPU-1"]


async def test_status_and_metrics_over_http(
        kubelet: KubeletStub, vendor: VendorPluginStub, service: Service) -> None:
    await kubelet.wait_list(SPOT, lambda d: len(d) == 2)
    port = await service.serve()  # stopped with the service
    async with asyncio.timeout(30):  # ready once all 11 plugins registered, not only the one listed above
        while not (status := json.loads(await get_ok(port, "/status")))["health"]["components"]["kubelet"]["ready"]:
            await asyncio.sleep(0.05)
    metrics = (await get_ok(port, "/metrics")).decode()
    assert status["service"] == "deviceplugin"
    by_resource = {p["resource"]: p for p in status["plugins"]}
    assert by_resource[SPOT]["registered"] is True
    assert by_resource[SPOT]["unhealthy"] == 2
    assert by_resource[SPOT]["socket"].endswith("gpushare-spot-gpu.sock")
    assert len(by_resource) == 11
    assert 'gpushare_deviceplugin_devices{health="Unhealthy",resource="gpushare/spot-gpu"} 2.0' \
        in metrics
    assert 'gpushare_deviceplugin_registered{resource="gpushare/spot-gpu"} 1.0' in metrics


async def test_missed_health_is_reread_after_reconnect(
        dp_settings: DevicePluginSettings, kubelet: KubeletStub, vendor: VendorPluginStub,
        subject_prefix: str) -> None:
    server = await asyncio.to_thread(NatsServer().start)
    nats = NatsSettings(url=server.url, prefix=f"{subject_prefix}.v1", kv_prefix=subject_prefix,
                        reconnect_wait_s=0.1, ensure_layout=True)
    svc = Service(common_settings(nats), dp_settings, KEY)
    svc.start_plugins()
    writer = Bus(nats, "test-solver")
    try:
        await svc.connect()
        await kubelet.wait_list(SPOT, lambda d: len(d) == 2)
        await asyncio.to_thread(server.restart)
        await writer.connect()
        await writer.wait_for_stream()
        store = await writer.store("health", writer.layout.scope(NODE, "health"))
        missed = events.DeviceHealth(node=NODE, resource="spot-gpu", full=True,
                                     devices={"spot-GPU-0": "Healthy"})
        await store.put("spot-gpu", missed)
        await kubelet.wait_list(SPOT, lambda d: d["spot-GPU-0"] == "Healthy", timeout=10)
    finally:
        await writer.drain()
        await svc.close()
        await asyncio.to_thread(server.cleanup)


async def test_run_serves_until_stopped(nats_settings: NatsSettings,
                                        dp_settings: DevicePluginSettings,
                                        kubelet: KubeletStub) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(Service(common_settings(nats_settings), dp_settings, KEY, stop=stop).run())
    await kubelet.wait_for(lambda: len(kubelet.plugins) == 11 and
                           all(p.lists for p in kubelet.plugins.values()), timeout=10)
    stop.set()
    assert await asyncio.wait_for(task, 10) == 0
    assert [n for n in os.listdir(dp_settings.plugin_dir) if n.startswith("gpushare-")] == []
    gc.unfreeze()  # run() froze the start-up heap of this whole test process


async def test_a_fence_is_applied_before_its_answer_and_says_what_is_served(
        kubelet: KubeletStub, vendor: VendorPluginStub, service: Service, bus: Bus) -> None:
    """The solver's fence (a desired health as a request): applied at once, answered with the
    health now served; an older one than the last applied changes nothing and says so; anything
    but a desired health is answered with nothing applied."""
    await publish_health(bus, {"spot-GPU-0": "Healthy", "spot-GPU-1": "Healthy"})
    await kubelet.wait_list(SPOT, lambda d: set(d.values()) == {"Healthy"})
    subject = bus.subjects.fence(NODE, "spot-gpu")
    fence = events.DeviceHealth(node=NODE, resource="spot-gpu", devices={"spot-GPU-0": "Unhealthy"})
    applied = await bus.request(subject, fence)
    assert isinstance(applied, events.HealthApplied) and applied.request_id == fence.id
    assert applied.devices == {"spot-GPU-0": "Unhealthy"}
    with pytest.raises(grpc.aio.AioRpcError, match="Unhealthy"):
        await kubelet.allocate(SPOT, ["spot-GPU-0"])
    assert (await kubelet.allocate(SPOT, ["spot-GPU-1"])).container_responses  # the other card: lent still
    stale = events.DeviceHealth(node=NODE, resource="spot-gpu", devices={"spot-GPU-1": "Unhealthy"}, ts=1.0)
    answer = await bus.request(subject, stale)
    assert isinstance(answer, events.HealthApplied) and answer.devices == {"spot-GPU-1": "Healthy"}
    wrong = await bus.request(subject, events.SpotEvent(node=NODE, pod="a/b", container="c", state="using"))
    assert isinstance(wrong, events.HealthApplied) and (wrong.resource, wrong.devices) == ("", {})
    await kubelet.wait_list(SPOT, lambda d: d == {"spot-GPU-0": "Unhealthy", "spot-GPU-1": "Healthy"})
