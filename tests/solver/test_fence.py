"""Fence first: a reclaim that takes spot devices back looks up their holders in the kubelet's
pod-resources only once the device plugin refuses every Allocate of them.

Before, the lookup raced the device's Unhealthy health on its way to the plugin (a core publish):
a pod the kubelet admitted onto the device after the lookup and before that health arrived was
nobody's borrower, and ran beside the owner until its own SpotEvent came. Real nats-server, the
real device-plugin service with a kubelet stub and a vendor plugin stub, the solver's reclaimer.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from gpushare_common.adapters.podresources import NodeDevices
from gpushare_common.events import DeviceHealth
from gpushare_common.settings import CommonSettings, HttpSettings, KubeSettings, LogSettings, NatsSettings, NodeSettings
from gpushare_deviceplugin.app import Service as DevicePluginService
from gpushare_deviceplugin.settings import DevicePluginSettings
from gpushare_solver.actions import Reclaim, ReclaimProgress
from gpushare_solver.metrics import SolverMetrics
from gpushare_solver.outbox import BusOutbox
from gpushare_solver.reclaim import Reclaimer
from gpushare_solver.settings import SolverSettings
from prometheus_client import CollectorRegistry

from tests.deviceplugin.conftest import KEY, kubelet, plugin_dir  # noqa: F401  (fixtures)
from tests.deviceplugin.stubs import KubeletStub, VendorPluginStub
from tests.solver.fakes import FakePods, FakeTasks
from tests.solver.world import client_bus

NODE = "gpu-node-1"
SPOT = "gpushare/spot-gpu"
OWNER = "dev/alice"


class Lookup:
    """The kubelet's pod-resources at the reclaim's lookup: nobody holds the card yet; what the
    device plugin would answer an Allocate of it at that instant is recorded."""

    def __init__(self, plugin: DevicePluginService) -> None:
        self.plugin = plugin
        self.served_then: list[str | None] = []

    async def list(self) -> NodeDevices:
        spot = self.plugin.plugins.spot
        assert spot is not None
        self.served_then.append(spot.board.health("spot-GPU-0"))
        return {}


@pytest.fixture
async def device_plugin(nats_settings: NatsSettings, plugin_dir: str,  # noqa: F811
                        kubelet: KubeletStub) -> AsyncIterator[DevicePluginService]:  # noqa: F811
    vendor = VendorPluginStub(os.path.join(plugin_dir, "vendor-nvidia.sock"), {"GPU-0": "Healthy"})
    await vendor.start()
    settings = DevicePluginSettings(plugin_dir=plugin_dir, vendor_sockets={"nvidia.com/gpu": "vendor-nvidia.sock"},
                                    poll_s=0.05, backoff_min_s=0.05, backoff_max_s=0.2, signing_key_file="",
                                    watch_shadow_pods=False)
    common = CommonSettings(nats=nats_settings, http=HttpSettings(host="127.0.0.1", port=0), log=LogSettings(),
                            node=NodeSettings(NODE), kube=KubeSettings())
    service = DevicePluginService(common, settings, KEY)
    service.start_plugins()
    try:
        await service.connect()
        yield service
    finally:
        await service.close()
        await vendor.stop()


async def test_no_pod_is_admitted_onto_a_card_taken_back_after_its_borrowers_are_looked_up(
        nats_settings: NatsSettings, kubelet: KubeletStub,  # noqa: F811
        device_plugin: DevicePluginService) -> None:
    async with client_bus(nats_settings) as bus:
        lent = DeviceHealth(node=NODE, resource="spot-gpu", devices={"spot-GPU-0": "Healthy"}, full=True)
        await bus.publish(bus.subjects.health(NODE, "spot-gpu"), lent)
        await kubelet.wait_list(SPOT, lambda d: d == {"spot-GPU-0": "Healthy"})
        lookup = Lookup(device_plugin)
        metrics = SolverMetrics(CollectorRegistry())
        reclaimer = Reclaimer(NODE, SolverSettings(), FakePods(), FakeTasks(), BusOutbox(bus, NODE, 2.0),
                              bus.subjects.eviction(NODE), metrics, allocations=lookup)
        # the owner is back; its card's Unhealthy health has not reached the device plugin (only
        # the fence will): the kubelet may still admit a pod onto spot-GPU-0 at any instant
        action = Reclaim(reason="owner-back", owner=OWNER, lent=("spot-GPU-0",))

        async def save() -> None:
            pass

        await reclaimer.run(action, ReclaimProgress(), "owner-back-1", time.time(), save)
        assert lookup.served_then == ["Unhealthy"], "looked up while the plugin still admitted pods onto the card"
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # a pod the kubelet admits after the lookup
            await kubelet.allocate(SPOT, ["spot-GPU-0"])
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert metrics.fences.labels("confirmed")._value.get() == 1
        await kubelet.wait_list(SPOT, lambda d: d == {"spot-GPU-0": "Unhealthy"})
