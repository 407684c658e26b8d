"""Benchmarks of the node simulator (no API server: the kubelet parts alone).

  python -m gpushare_sim.node.bench [--pods 20] [--allocations 500] [--json FILE]

Figures: Allocate round trip through the device manager to the fake vendor
plugin; card health change -> device table (ListAndWatch propagation); pod
start (admission + container running) and pod removal, as plain processes and,
when root and containerd are there, as containers in a private containerd (with
gpushare-runtime when installed) started both ways: through its CRI plugin as a
kubelet does (a pod sandbox, then the container) and with ``ctr run``; exporter
scrape time with busy cards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from gpushare_sim.node.adapters.backend import containerd_usable
from gpushare_sim.node.app import NodeSim
from gpushare_sim.node.model import parse_pod
from gpushare_sim.node.settings import NodeSimSettings
from gpushare_sim.node.testing import pod_manifest, running_node, short_sim_dir, wait_until

GPU = "nvidia.com/gpu"
Figure = dict[str, Any]
FINE = 0.001  # poll interval while timing (s)
RUNNER_LABELS = {"process": "process", "cri": "containerd CRI", "containerd": "containerd ctr run"}


def pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def figure(metric: str, value: float, unit: str, target: str = "") -> Figure:
    return {"metric": metric, "value": value, "unit": unit, "target": target}


async def bench_allocate(sim: NodeSim, count: int) -> list[Figure]:
    samples = []
    for i in range(count):
        card = f"GPU-{sim.settings.name}-{i % len(sim.cards)}"
        start = time.perf_counter()
        await sim.plugins.allocate(GPU, [card])
        samples.append(time.perf_counter() - start)
    return [figure("Allocate round trip p50", ms(pct(samples, 50)), "ms"),
            figure("Allocate round trip p99", ms(pct(samples, 99)), "ms", "<= 20")]  # fmt: skip


async def bench_health(sim: NodeSim, count: int) -> list[Figure]:
    assert sim.vendor is not None
    samples = []
    card = sim.cards[0].device_id
    for i in range(count):
        healthy = i % 2 == 1
        start = time.perf_counter()
        await sim.vendor.set_health(card, healthy)
        await wait_until(lambda h=healthy: sim.table.resources[GPU][card] == h, 5, "health", FINE)
        samples.append(time.perf_counter() - start)
    return [figure("card health -> device table p50", ms(pct(samples, 50)), "ms", "<= 100")]


async def bench_pods(sim: NodeSim, mode: str, count: int) -> list[Figure]:
    starts, removals = [], []
    command = ["gpuload", "--util", "20", "--every-ms", "500"]
    for i in range(count):
        uid = f"bench-{i}"
        pod = parse_pod(pod_manifest(f"p{i}", command, node=sim.settings.name, uid=uid,
                                     resources={GPU: "1"}))  # fmt: skip
        start = time.perf_counter()
        await sim.kubelet.sync([pod])
        await wait_until(lambda u=uid: _running(sim, u), 30, f"pod {uid} running", FINE)
        starts.append(time.perf_counter() - start)
        start = time.perf_counter()
        await sim.kubelet.sync([])
        await wait_until(lambda: not sim.kubelet.workers, 30, f"pod {uid} removed", FINE)
        removals.append(time.perf_counter() - start)
    return [
        figure(f"pod start ({mode}) p50", ms(statistics.median(starts)), "ms"),
        figure(f"pod start ({mode}) max", ms(max(starts)), "ms"),
        figure(f"pod removal ({mode}) p50", ms(statistics.median(removals)), "ms"),
    ]


def _running(sim: NodeSim, uid: str) -> bool:
    worker = sim.kubelet.workers.get(uid)
    return worker is not None and all(c.running for c in worker.containers)


async def bench_exporter(sim: NodeSim, count: int) -> list[Figure]:
    assert sim.exporter is not None
    pods = [parse_pod(pod_manifest(f"e{i}", ["gpuload", "--util", "30", "--every-ms", "200"],
                                   node=sim.settings.name, uid=f"e{i}", resources={GPU: "1"}))
            for i in range(len(sim.cards))]  # fmt: skip
    await sim.kubelet.sync(pods)
    await wait_until(lambda: all(_running(sim, p.uid) for p in pods), 30, "exporter workloads")
    await wait_until(_all_reporting(sim), 15, "every card reporting")
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        await sim.exporter.scrape()
        samples.append(time.perf_counter() - start)
    await sim.kubelet.sync([])
    await wait_until(lambda: not sim.kubelet.workers, 30, "exporter workloads removed")
    return [figure(f"exporter scrape ({len(sim.cards)} busy cards) p50",
                   ms(pct(samples, 50)), "ms", "<= 20")]  # fmt: skip


def _all_reporting(sim: NodeSim) -> Any:
    async def probe() -> bool:
        assert sim.exporter is not None
        text = await sim.exporter.scrape()
        utils = [ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_GPU_UTIL{")]
        return len(utils) == len(sim.cards) and all(ln.endswith(" 30") for ln in utils)

    return probe


async def run(args: argparse.Namespace) -> list[Figure]:
    figures: list[Figure] = []
    modes = [("none", "cri")]
    if containerd_usable() and not args.no_containerd:
        modes += [("auto", "cri"), ("auto", "ctr")]
    for mode, api in modes:
        sim_dir = short_sim_dir()
        settings = NodeSimSettings(name="bench", sim_dir=sim_dir, gpus=8, containerd=mode, containerd_api=api)
        try:
            async with running_node(settings) as sim:
                await wait_until(lambda s=sim: s.table.allocatable().get(GPU) == 8, 10, "cards")
                label = RUNNER_LABELS.get(sim.kubelet.runner.kind, sim.kubelet.runner.kind)
                if mode == "none":
                    figures += await bench_allocate(sim, args.allocations)
                    figures += await bench_health(sim, 50)
                    figures += await bench_exporter(sim, 50)
                figures += await bench_pods(sim, label, args.pods)
        finally:
            shutil.rmtree(sim_dir, ignore_errors=True)
    return figures + ratio(figures, "pod start ({}) p50", "containerd CRI", "containerd ctr run")


def ratio(figures: list[Figure], metric: str, first: str, second: str) -> list[Figure]:
    """``first`` / ``second`` of one metric measured in the same run (none when one is missing)."""
    values = {f["metric"]: f["value"] for f in figures}
    a, b = values.get(metric.format(first)), values.get(metric.format(second))
    if a is None or not b:
        return []
    return [figure(metric.format(f"{first} / {second}"), round(a / b, 3), "x")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpushare_sim.node.bench")
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--allocations", type=int, default=500)
    parser.add_argument("--no-containerd", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    figures = asyncio.run(run(args))
    for f in figures:
        print(f"{f['metric']:<44} {f['value']:>10} {f['unit']:<3} {f['target']}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
