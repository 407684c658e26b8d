"""The detector reads the node simulator's kubelet pod-resources API and its DCGM-style exporter."""

from __future__ import annotations

import time
from pathlib import Path

from gpushare_common.adapters.podresources import PodResources
from gpushare_detector.gpumetrics import device_metrics
from gpushare_detector.vendors import BUILTIN_DIR, load_mappings
from gpushare_sim.fakegpu.cards import VENDOR_RESOURCE, make_cards
from gpushare_sim.fakegpu.exporter import Report, render
from gpushare_sim.node.adapters.podresources import PodResourcesServer
from gpushare_sim.node.devices import ContainerKey, DeviceTable

NODE = "node-1"


async def test_sim_pod_resources(tmp_path: Path) -> None:
    table = DeviceTable()
    table.set_devices(VENDOR_RESOURCE, {"GPU-node-1-0": True, "GPU-node-1-1": True})
    table.record(ContainerKey("u1", "dev", "alice", "main"), VENDOR_RESOURCE, ["GPU-node-1-1"])
    server = PodResourcesServer(tmp_path / "kubelet.sock", table,
                                lambda: [("dev", "alice", "u1", ["main", "dind"])])
    await server.start()
    client = PodResources(str(tmp_path / "kubelet.sock"))
    try:
        assert await client.list() == {"dev/alice": {"main": {VENDOR_RESOURCE: ("GPU-node-1-1",)}, "dind": {}}}
        assert await client.get("dev", "alice") == {"main": {VENDOR_RESOURCE: ("GPU-node-1-1",)}, "dind": {}}
    finally:
        await client.close()
        await server.stop()


def test_sim_exporter_text_with_the_dcgm_mapping(tmp_path: Path) -> None:
    cards = make_cards(tmp_path, NODE, 2)
    now = time.time()
    reports = [Report("dev", "alice", "main", card=0, util=40, mem_mib=1024, ts=now, every_ms=1000)]
    text = render(NODE, cards, reports, {"GPU-node-1-0": ("dev", "alice", "main")}, total_mib=8192, now=now)
    devices, problems = device_metrics(load_mappings(BUILTIN_DIR)["nvidia-dcgm"], text)
    assert not problems
    busy, idle = devices["GPU-node-1-0"], devices["GPU-node-1-1"]
    assert (busy.utilisation, busy.memory_used, busy.memory_total) == (40, 1024 << 20, 8192 << 20)
    assert (busy.namespace, busy.pod, busy.container, busy.node) == ("dev", "alice", "main", NODE)
    assert idle.utilisation == 0 and idle.pod == ""
