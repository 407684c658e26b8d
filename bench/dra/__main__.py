"""The DRA driver as the kubelet meets it: the real service process over its DRA socket, the API
emulator, a vendor plugin and NATS.

  python -m bench.dra [--claims 1000] [--toggles 200]

Figures:
- NodePrepareResources of a claim of one shared device (a new claim each time: the claim read
  from the API, its allocation checked, its CDI spec written and recorded) p50/p99, target p99
  <= 5 ms; the same call for a claim already prepared; NodeUnprepareResources;
- the node's ResourceSlice written again after its inventory changed (a card turns unhealthy,
  then healthy, at the vendor plugin) until the API serves it, p50/p99, target p99 <= 50 ms;
- the driver's resident memory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
from gpushare_common import dra
from gpushare_common.adapters.kube import resource_path
from gpushare_common.adapters.kubeletapi import dra_v1_pb2 as pb
from gpushare_common.adapters.kubeletapi import dra_v1_pb2_grpc as pb_grpc
from gpushare_sim.node.adapters.kube import SimKube

from bench.deviceplugin.__main__ import collector_paused, rss_mb
from bench.report import Row, emit, percentile
from tests.deviceplugin.stubs import VendorPluginStub
from tests.support.kubeapi import start_kube_api
from tests.support.nats import NatsServer, free_port

PART = "dra"
NODE = "bench-dra-1"
CARDS = {f"GPU-{i}": "Healthy" for i in range(8)}
LIVE = 16  # claims prepared at any time (a busy node), the oldest unprepared as a new one comes


def driver_env(work: Path, nats_url: str, kubeconfig: Path) -> dict[str, str]:
    return {
        **os.environ, "GPUSHARE_NODE_NAME": NODE, "GPUSHARE_NATS_URL": nats_url,
        "GPUSHARE_NATS_ENSURE_LAYOUT": "true", "GPUSHARE_NATS_PREFIX": "bench.v1",
        "GPUSHARE_NATS_KV_PREFIX": "benchdra", "GPUSHARE_HTTP_HOST": "127.0.0.1",
        "GPUSHARE_HTTP_PORT": str(free_port()), "GPUSHARE_KUBE_KUBECONFIG": str(kubeconfig),
        "GPUSHARE_LOG_LEVEL": "WARNING", "GPUSHARE_DRA_REGISTRY_DIR": str(work / "registry"),
        "GPUSHARE_DRA_PLUGIN_DIR": str(work / "plugin"), "GPUSHARE_DRA_CDI_DIR": str(work / "cdi"),
        "GPUSHARE_DRA_DEVICE_PLUGIN_DIR": str(work), "GPUSHARE_DRA_VENDOR_SOCKETS": "nvidia.com/gpu=vendor.sock",
        "GPUSHARE_DRA_RUNTIME_CONFIG": str(work / "runtime.json"), "GPUSHARE_DRA_HOST_ROOT": str(work),
        "GPUSHARE_DRA_ISOLATION_DIR": str(work / "isolation"),
        "GPUSHARE_DRA_CARD_MEMORY_MIB": "nvidia.com/gpu=81920",
    }


@contextlib.contextmanager
def driver_process(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gpushare_dra_driver"], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def make_claim(kube: SimKube, index: int) -> pb.Claim:
    """A claim of 25 shares of one card, allocated on the node (as the scheduler leaves it)."""
    name = f"c{index}"
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "bench"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": dra.SHARE_CLASS, "capacity": {"requests": {dra.SHARES: "25"}}}}]}}}
    made = await kube.create_object(resource_path("resourceclaims", "bench"), body)
    result = {"request": "gpu", "driver": dra.DRIVER, "pool": NODE, "device": f"gpu-{index % len(CARDS)}",
              "consumedCapacity": {dra.SHARES: "25"}, "shareID": str(uuid.uuid4())}
    await kube.patch_object(resource_path("resourceclaims", "bench", name, "status"),
                            {"status": {"allocation": {"devices": {"results": [result]}}}})
    return pb.Claim(namespace="bench", name=name, uid=made["metadata"]["uid"])


async def prepare_cycle(stub: Any, claims: list[pb.Claim]) -> tuple[list[float], list[float], list[float]]:
    prepare, again, unprepare = [], [], []
    live: list[pb.Claim] = []
    with collector_paused():
        for claim in claims:
            started = time.perf_counter()
            reply = await stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[claim]))
            prepare.append(time.perf_counter() - started)
            assert not reply.claims[claim.uid].error, reply.claims[claim.uid].error
            started = time.perf_counter()
            await stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[claim]))
            again.append(time.perf_counter() - started)
            live.append(claim)
            if len(live) > LIVE:
                old = live.pop(0)
                started = time.perf_counter()
                await stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=[old]))
                unprepare.append(time.perf_counter() - started)
    return prepare, again, unprepare


async def slice_state(kube: SimKube) -> tuple[str, bool]:
    (found,) = await kube.list_resource_slices(f"spec.nodeName={NODE}")
    tainted = any(d.get("taints") for d in found["spec"]["devices"] if d["name"] == "gpu-0")
    return str(found["metadata"]["resourceVersion"]), tainted


async def republish(kube: SimKube, vendor: VendorPluginStub, count: int) -> list[float]:
    latencies = []
    for index in range(count):
        healthy = index % 2 == 1
        started = time.perf_counter()
        vendor.set_devices({**CARDS, "GPU-0": "Healthy" if healthy else "Unhealthy"})
        while (await slice_state(kube))[1] == healthy:
            await asyncio.sleep(0.0005)
        latencies.append(time.perf_counter() - started)
    return latencies


def latency_rows(name: str, samples: list[float], target_p99_ms: float | None = None) -> list[Row]:
    p50, p99 = percentile(samples, 50) * 1e3, percentile(samples, 99) * 1e3
    target = f"<= {target_p99_ms} ms" if target_p99_ms else ""
    return [Row(PART, f"{name} p50 (n={len(samples)})", p50, "ms"),
            Row(PART, f"{name} p99 (n={len(samples)})", p99, "ms", target,
                None if target_p99_ms is None else p99 <= target_p99_ms)]


async def measure(args: argparse.Namespace, work: Path, nats: NatsServer, kubeconfig: Path) -> list[Row]:
    vendor = VendorPluginStub(str(work / "vendor.sock"), CARDS)
    await vendor.start()
    kube = SimKube.from_kubeconfig(str(kubeconfig))
    env = driver_env(work, nats.url, kubeconfig)
    try:
        claims = [await make_claim(kube, i) for i in range(args.claims)]
        with driver_process(env, work / "driver.log") as proc:
            deadline = time.monotonic() + 60
            while not (work / "plugin" / "dra.sock").exists() or not await kube.list_resource_slices():
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"the driver did not come up: {(work / 'driver.log').read_text()[-2000:]}")
                await asyncio.sleep(0.05)
            async with grpc.aio.insecure_channel(f"unix://{work / 'plugin' / 'dra.sock'}") as channel:
                stub = pb_grpc.DRAPluginStub(channel)
                await prepare_cycle(stub, claims[:50])  # warm-up
                prepare, again, unprepare = await prepare_cycle(stub, claims[50:])
            rows = latency_rows("NodePrepareResources, a claim of one shared device", prepare, 5)
            rows += latency_rows("NodePrepareResources, the claim already prepared", again)
            rows += latency_rows("NodeUnprepareResources", unprepare)
            await republish(kube, vendor, 10)  # warm-up
            rows += latency_rows("inventory change -> slice served by the API", await republish(
                kube, vendor, args.toggles), 50)
            rss, _ = rss_mb(proc.pid)
            rows.append(Row(PART, "driver RSS after the runs", rss, "MB"))
            rows.append(Row(PART, "machine load average (1 min) at the end", os.getloadavg()[0], "runnable"))
        return rows
    finally:
        await kube.close()
        await vendor.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dra")
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--toggles", type=int, default=200)
    args = parser.parse_args()
    args.claims = max(args.claims, 60)
    nats = NatsServer().start()
    try:
        with tempfile.TemporaryDirectory(prefix="drab-", dir="/tmp") as tmp, start_kube_api() as api:
            api.namespaces("bench")
            rows = asyncio.run(measure(args, Path(tmp), nats, api.kubeconfig))
    finally:
        nats.cleanup()
    emit(rows)


if __name__ == "__main__":
    main()
