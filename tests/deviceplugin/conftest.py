"""Fixtures of the device-plugin tests: a short temporary plugin directory, a kubelet stub."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator

import pytest
from gpushare_deviceplugin.handlers.base import Signer
from gpushare_deviceplugin.plugins.manager import PluginSet
from gpushare_deviceplugin.plugins.metrics import PluginMetrics
from gpushare_deviceplugin.settings import DevicePluginSettings
from gpushare_sim.shorttmp import short_mkdtemp
from prometheus_client import CollectorRegistry

from .stubs import KubeletStub

KEY = b"0123456789abcdef0123456789abcdef"
NODE = "gpu-node-1"


@pytest.fixture
def plugin_dir() -> Iterator[str]:
    # unix socket paths are limited to 107 bytes: keep the directory short
    path = str(short_mkdtemp("dp-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def settings(plugin_dir: str) -> DevicePluginSettings:
    return DevicePluginSettings(
        plugin_dir=plugin_dir, vendor_sockets={"nvidia.com/gpu": "vendor-nvidia.sock"},
        capacity_resources=("vcpu", "vmem"), poll_s=0.05, backoff_min_s=0.05,
        backoff_max_s=0.2, signing_key_file="",
    )


@pytest.fixture
def plugin_set(settings: DevicePluginSettings) -> PluginSet:
    return PluginSet(settings, Signer(KEY, NODE), PluginMetrics(CollectorRegistry()))


@pytest.fixture
async def kubelet(plugin_dir: str) -> AsyncIterator[KubeletStub]:
    stub = KubeletStub(plugin_dir)
    await stub.start()
    yield stub
    await stub.stop()
