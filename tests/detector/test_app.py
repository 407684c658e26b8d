"""The detector as a process: environment settings, real servers, HTTP endpoints, clean shutdown."""

from __future__ import annotations

import asyncio
from pathlib import Path

import kubernetes
from gpushare_common import events as ev
from gpushare_common.bus import Bus
from gpushare_common.settings import NatsSettings

from tests.detector import podfactory as pf
from tests.detector.harness import NODE, Collector, is_
from tests.detector.podres_server import PodResourcesServer
from tests.detector.process import start_detector
from tests.support.kubeapi import KubeApi


async def test_detector_process_end_to_end(nats_settings: NatsSettings, kube_api: KubeApi,
                                           podresources: PodResourcesServer, tmp_path: Path) -> None:
    bus = Bus(nats_settings, "observer")
    await bus.connect()
    seen = Collector()
    await bus.subscribe(bus.subjects.node_events(NODE), seen)
    capacity = Collector()
    await bus.subscribe(bus.subjects.node_capacity(NODE), capacity)
    core = kubernetes.client.CoreV1Api(kube_api.client)
    await asyncio.to_thread(core.create_namespace, {"metadata": {"name": "ns"}})  # type: ignore[arg-type]
    podresources.table["ns/dev"] = {"main": {"nvidia.com/gpu": ("G1",)}}
    await asyncio.to_thread(core.create_namespaced_pod, "ns", pf.reserved("dev"))  # type: ignore[arg-type]

    detector = start_detector(nats_settings, kube_api.kubeconfig, podresources.socket, tmp_path,
                              capacity_s="0.2", resync_s="1")
    try:
        await asyncio.to_thread(detector.wait_ready)
        using = await seen.wait_for(is_(ev.ReservedEvent, pod="ns/dev", state="using"), timeout=15)
        assert using.devices == ("G1",)  # type: ignore[union-attr]
        await capacity.wait_for(is_(ev.SpareCapacity, resource="vmem"), timeout=15)
        status, body = await asyncio.to_thread(detector.get, "/status")
        assert status == 200 and body["pods"] == {"reserved": 1} and body["node"] == NODE
        assert set(body["capacity"]["resources"]) == {"vcpu", "vmem"}
        _, metrics = await asyncio.to_thread(detector.get, "/metrics")
        assert 'gpushare_detector_events_published_total{kind="generic"}' in metrics
    finally:
        code = await asyncio.to_thread(detector.stop)
        await bus.drain()
    assert code == 0, detector.log.read_text()[-3000:]
