"""Plugins against a real gRPC kubelet stub: registration, ListAndWatch, restarts."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import grpc
import pytest
from gpushare_common import events
from gpushare_deviceplugin.handlers.share import ShadowPodView
from gpushare_deviceplugin.plugins.manager import PluginSet
from gpushare_deviceplugin.plugins.supervisor import Supervisor
from gpushare_deviceplugin.settings import DevicePluginSettings

from .stubs import KubeletStub

ALL = 11  # 4 share + 4 share-dev + spot + vcpu + vmem


@pytest.fixture
async def running(plugin_set: PluginSet, settings: DevicePluginSettings
                  ) -> AsyncIterator[Supervisor]:
    supervisor = Supervisor(plugin_set.plugins, settings.kubelet_path, settings.poll_s,
                            settings.backoff_min_s, settings.backoff_max_s)
    stop = asyncio.Event()
    task = asyncio.create_task(supervisor.run(stop))
    yield supervisor
    stop.set()
    await asyncio.wait_for(task, 5)


def registered(kubelet: KubeletStub) -> bool:
    return len(kubelet.plugins) == ALL and all(p.lists for p in kubelet.plugins.values())


async def test_every_plugin_registers_and_lists(kubelet: KubeletStub, running: Supervisor,
                                                plugin_dir: str) -> None:
    await kubelet.wait_for(lambda: registered(kubelet))
    assert sorted(kubelet.plugins) == sorted(p.resource for p in running.plugins)
    assert kubelet.latest("gpushare/share-gpu-4") == {}
    assert all(p.state == "registered" for p in running.plugins)
    assert "gpushare-share-dev-gpu-16.sock" in os.listdir(plugin_dir)


async def test_shadow_pod_change_is_pushed_at_once(
        kubelet: KubeletStub, running: Supervisor, plugin_set: PluginSet) -> None:
    await kubelet.wait_for(lambda: registered(kubelet))
    plugin_set.replace_shadows([ShadowPodView("team-a", "shadow-x", "share", 2)])
    listed = await kubelet.wait_list("gpushare/share-gpu-2", lambda d: len(d) == 2)
    assert listed == {"team-a/shadow-x-0": "Healthy", "team-a/shadow-x-1": "Healthy"}
    response = await kubelet.allocate("gpushare/share-gpu-2", ["team-a/shadow-x-1"])
    annotations = dict(response.container_responses[0].annotations)
    assert annotations["gpushare.k8s.io/container-devices-from.*"] == (
        '{"team-a/shadow-x/main":{"*":["team-a/shadow-x-1"]}}')
    plugin_set.replace_shadows([])
    await kubelet.wait_list("gpushare/share-gpu-2", lambda d: d == {})


async def test_unhealthy_recovers_without_restart(
        kubelet: KubeletStub, running: Supervisor, plugin_set: PluginSet) -> None:
    await kubelet.wait_for(lambda: registered(kubelet))
    plugin_set.spot.set_vendor_cards("nvidia.com/gpu", {"GPU-a": "Healthy"})  # type: ignore[union-attr]
    await kubelet.wait_list("gpushare/spot-gpu", lambda d: d == {"spot-GPU-a": "Unhealthy"})
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await kubelet.allocate("gpushare/spot-gpu", ["spot-GPU-a"])
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    plugin_set.apply(events.DeviceHealth(node="n1", resource="spot-gpu",
                                         devices={"spot-GPU-a": "Healthy"}))
    await kubelet.wait_list("gpushare/spot-gpu", lambda d: d == {"spot-GPU-a": "Healthy"})
    response = await kubelet.allocate("gpushare/spot-gpu", ["spot-GPU-a"])
    annotations = dict(response.container_responses[0].annotations)
    assert annotations["gpushare.k8s.io/container-devices-ids.*"] == '{"nvidia.com/gpu":["GPU-a"]}'
    assert kubelet.registrations.count("gpushare/spot-gpu") == 1


async def test_kubelet_restart_registers_everything_again(
        kubelet: KubeletStub, running: Supervisor) -> None:
    await kubelet.wait_for(lambda: registered(kubelet))
    await kubelet.restart()
    await kubelet.wait_for(lambda: registered(kubelet))
    assert len(kubelet.registrations) == ALL


async def test_vanished_plugin_sockets_are_restarted(
        kubelet: KubeletStub, running: Supervisor) -> None:
    await kubelet.wait_for(lambda: registered(kubelet))
    await kubelet.restart(wipe_plugin_sockets=True)
    await kubelet.wait_for(lambda: registered(kubelet))
    for plugin in running.plugins:
        assert not plugin.socket_lost(), plugin.resource


async def test_kubelet_absent_then_present(plugin_dir: str, running: Supervisor) -> None:
    async with asyncio.timeout(5):  # the plugins serve while no kubelet is there
        while not all(p.state == "serving" for p in running.plugins):
            await asyncio.sleep(0.02)
    stub = KubeletStub(plugin_dir)
    await stub.start()
    try:
        await stub.wait_for(lambda: registered(stub))
    finally:
        await stub.stop()


async def test_periodic_resend_without_change(plugin_set: PluginSet, kubelet: KubeletStub,
                                              settings: DevicePluginSettings) -> None:
    for plugin in plugin_set.plugins:
        plugin.resend_s = 0.05
    supervisor = Supervisor(plugin_set.plugins, settings.kubelet_path, settings.poll_s)
    stop = asyncio.Event()
    task = asyncio.create_task(supervisor.run(stop))
    try:
        await kubelet.wait_for(lambda: (p := kubelet.plugins.get("gpushare/vcpu")) is not None
                               and len(p.lists) >= 3)
        assert kubelet.plugins["gpushare/vcpu"].lists[-1] == {}
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
