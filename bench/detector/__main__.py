"""Detector benchmark: a node with 500 pods on real servers.

  python -m bench.detector [--pods 500] [--changes 100] [--rounds 10]

Figures: CPU time of a full resync; pod change -> event published (inside the
detector: watch change received -> JetStream ack, and end to end: API write ->
event received by a NATS subscriber); RSS of the detector process holding the
500 pods; spare-capacity computation for 200 pods (cgroup v2 tree).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import kubernetes
from gpushare_common import events as ev
from gpushare_common.adapters.kube import Kube, PodChange
from gpushare_common.bus import Bus
from gpushare_common.settings import KubeSettings, NatsSettings

from bench.detector.capacity import capacity_rows
from bench.report import Row, emit, median, percentile
from tests.detector import podfactory as pf
from tests.detector.harness import NODE, Collector, build
from tests.detector.podres_server import PodResourcesServer, serve_pod_resources
from tests.detector.process import start_detector
from tests.support.kubeapi import KubeApi, start_kube_api
from tests.support.nats import NatsServer

PART = "detector"


def node_pods(count: int) -> tuple[list[dict[str, object]], dict[str, dict[str, dict[str, tuple[str, ...]]]]]:
    """A node's pods (8% ShadowPods, 24% SharePods, 12% spot, 16% reserved, the rest ordinary)."""
    pods: list[dict[str, object]] = []
    table: dict[str, dict[str, dict[str, tuple[str, ...]]]] = {}
    for i in range(count):
        share = i % 25
        if share < 2:
            pods.append(pf.shadow(f"shadow-{i}"))
            table[f"{pf.SYSTEM}/shadow-{i}"] = {"main": {"nvidia.com/gpu": (f"GPU-{i}",)}}
        elif share < 8:
            pods.append(pf.share(f"share-{i}"))
            shadow_device = f"{pf.SYSTEM}/shadow-{i - i % 25}-{share % 4}"
            table[f"ns/share-{i}"] = {"app": {"gpushare/share-gpu-4": (shadow_device,)}}
        elif share < 11:
            pods.append(pf.spot(f"spot-{i}"))
            table[f"ns/spot-{i}"] = {"job": {"gpushare/spot-gpu": (f"spot-GPU-{i}",)}}
        elif share < 15:
            pods.append(pf.reserved(f"dev-{i}", lendable=share % 2 == 0))
            table[f"ns/dev-{i}"] = {"main": {"nvidia.com/gpu": (f"GPU-{i}",)}, "dind": {}}
        else:
            pods.append(pf.pod(f"web-{i}", requests={"main": {"cpu": "1"}}))
    return pods, table


def load_pods(api: KubeApi, pods: list[dict[str, object]]) -> None:
    core = kubernetes.client.CoreV1Api(api.client)
    core.create_namespace({"metadata": {"name": "ns"}})
    for pod in pods:
        meta = pod["metadata"]
        assert isinstance(meta, dict)
        core.create_namespaced_pod(meta["namespace"], pod)  # ShadowPods in the system namespace
        core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": {"phase": "Running"}})


async def resync_cpu(detector: object, rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        start = time.process_time()
        await detector.resync()  # type: ignore[attr-defined]
        samples.append((time.process_time() - start) * 1000)
    return samples


async def churn(api: KubeApi, podres: PodResourcesServer, detector: object, seen: Collector,
                changes: int) -> tuple[list[float], list[float]]:
    """Create then delete reserved pods; (in-detector ms, end-to-end ms) per change."""
    inside: list[float] = []
    original = detector.on_change  # type: ignore[attr-defined]

    async def timed(change: PodChange) -> None:
        start = time.perf_counter()
        await original(change)
        if change.pod is not None and change.pod["metadata"]["name"].startswith("churn-"):
            inside.append((time.perf_counter() - start) * 1000)

    detector.on_change = timed  # type: ignore[attr-defined]
    core = kubernetes.client.CoreV1Api(api.new_client())
    end_to_end: list[float] = []
    for i in range(changes):
        name = f"churn-{i}"
        podres.table[f"ns/{name}"] = {"main": {"nvidia.com/gpu": (f"GPU-c{i}",)}}
        for action, state in (("create", "using"), ("delete", "cleared")):
            start = time.perf_counter()
            if action == "create":
                await asyncio.to_thread(core.create_namespaced_pod, "ns", pf.reserved(name))
            else:
                podres.table.pop(f"ns/{name}")
                await asyncio.to_thread(core.delete_namespaced_pod, name, "ns", grace_period_seconds=0)
            await seen.wait_for(lambda e, n=name, s=state: isinstance(e, ev.ReservedEvent)
                                and e.pod == f"ns/{n}" and e.state == s, timeout=10)
            end_to_end.append((time.perf_counter() - start) * 1000)
    detector.on_change = original  # type: ignore[attr-defined]
    core.api_client.close()
    return inside, end_to_end


# as in a container image: bytecode compiled once (this environment may disable writing it)
BYTECODE = {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(Path(tempfile.gettempdir()) /
                                                                     "gpushare-bench-pycache")}
FLOOR = ("import gpushare_detector.app\n"
         "import gpushare_common.adapters.kube\n"  # the service's own Kubernetes client
         "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmRSS')][0])")


def import_floor_mib() -> float:
    """RSS of a process that only imported the service's modules (the libraries' floor)."""
    env = {**os.environ, **BYTECODE}
    subprocess.run([sys.executable, "-c", FLOOR], env=env, check=True, capture_output=True)  # compile
    out = subprocess.run([sys.executable, "-c", FLOOR], env=env, check=True, capture_output=True, text=True)
    return int(out.stdout.strip()) / 1024


async def detector_rss(nats: NatsSettings, api: KubeApi, podres: PodResourcesServer, workdir: Path,
                       pods: int) -> float:
    proc = start_detector(nats, api.kubeconfig, podres.socket, workdir, environ=BYTECODE, resync_s="2",
                          capacity_s="1")
    try:
        await asyncio.to_thread(proc.wait_ready, 60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            _, status = await asyncio.to_thread(proc.get, "/status")
            if sum(status["pods"].values()) >= pods and status["last_resync_age_s"] is not None:
                break
            await asyncio.sleep(0.5)
        return proc.rss_bytes() / (1 << 20)
    finally:
        await asyncio.to_thread(proc.stop)


async def run(args: argparse.Namespace) -> list[Row]:
    server = NatsServer().start()
    workdir = Path(tempfile.mkdtemp(prefix="bench-detector-"))
    nats = NatsSettings(url=server.url, prefix="bench.v1", stream="BENCH_DETECTOR", kv_prefix="benchdet",
                        stream_max_bytes=256 << 20)
    try:
        with start_kube_api(directory=workdir) as api:
            async with serve_pod_resources(workdir / "kubelet.sock") as podres:
                pods, table = node_pods(args.pods)
                podres.table.update(table)
                await asyncio.to_thread(load_pods, api, pods)
                return await measure(args, nats, api, podres, workdir)
    finally:
        server.cleanup()


async def measure(args: argparse.Namespace, nats: NatsSettings, api: KubeApi, podres: PodResourcesServer,
                  workdir: Path) -> list[Row]:
    bus = Bus(nats, "bench-detector")
    await bus.connect()
    await bus.ensure_layout()  # this bench installs its own stream (a cluster's installer does it there)
    await bus.wait_for_stream()
    seen = Collector()
    await bus.subscribe(bus.subjects.node_events(NODE), seen)
    detector = build(bus, str(podres.socket))
    kube = Kube(KubeSettings(kubeconfig=str(api.kubeconfig)))
    stop = asyncio.Event()
    watch = asyncio.create_task(detector.watch(kube.watch_pods(stop, field_selector=f"spec.nodeName={NODE}")))
    await asyncio.wait_for(detector.synced.wait(), 60)
    facts = len(detector.tracker.current())
    cpu = await resync_cpu(detector, args.rounds)
    inside, end_to_end = await churn(api, podres, detector, seen, args.changes)
    stop.set()
    await watch
    await detector.devices.close()  # type: ignore[attr-defined]
    await kube.close()
    await bus.drain()
    floor = await asyncio.to_thread(import_floor_mib)
    rss = await detector_rss(nats, api, podres, workdir, args.pods)
    return [
        Row(PART, f"full resync, {args.pods} pods ({facts} facts), CPU median", median(cpu), "ms"),
        Row(PART, f"full resync, {args.pods} pods, CPU max", max(cpu), "ms", "<= 200", max(cpu) <= 200),
        Row(PART, "pod change -> event published p50 (in detector)", percentile(inside, 50), "ms"),
        Row(PART, "pod change -> event published p99 (in detector)", percentile(inside, 99), "ms", "<= 20",
            percentile(inside, 99) <= 20),
        Row(PART, "API write -> event received p99 (end to end)", percentile(end_to_end, 99), "ms"),
        Row(PART, f"detector process RSS, {args.pods} pods", rss, "MiB", "<= 100", rss <= 100),
        Row(PART, "RSS after importing the service's libraries only", floor, "MiB"),
        Row(PART, f"RSS above that floor, {args.pods} pods running", rss - floor, "MiB"),
        *capacity_rows(PART),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.detector")
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=10)
    emit(asyncio.run(run(parser.parse_args())))


if __name__ == "__main__":
    main()
