"""The DRA driver as the kubelet meets it: the real service process over its DRA socket, the API
emulator in its own process (as an API server is on a cluster), a vendor plugin and NATS. The
driver's CDI directory is on tmpfs, as ``/var/run/cdi`` is on a node; the kubelet's side of
each call is a blocking gRPC stub (nothing else runs in the measuring process meanwhile).

  python -m bench.dra [--claims 1000] [--toggles 200] [--placement all|one-core|split|any]

Figures, for each placement of the processes: "one-core", every process on one core; "split",
the node's processes (the kubelet's side, the driver, the vendor plugin) on one core and the
control plane (API emulator, NATS) on another, as a cluster's API server is not on the node;
"any", wherever the scheduler puts them:
- NodePrepareResources of a claim of one shared device (a new claim each time: the claim read
  from the API, its allocation checked, its CDI spec written and recorded) p50/p99, target p99
  <= 5 ms; beside it, from the driver's own histogram (``gpushare_dra_prepare_part_seconds``,
  0.1 ms buckets to 2 ms, interpolated), the driver's own time without the claim's read from
  the API and that read alone, so a regression shows where it is; the same call for a claim
  already prepared (the driver answers from memory: this machine's gRPC round trip, the floor
  under every other figure); NodeUnprepareResources;
- the node's ResourceSlice written again after its inventory changed (a card turns unhealthy,
  then healthy, at the vendor plugin) until the API serves it, p50/p99, target p99 <= 50 ms;
- the driver's resident memory;
- the machine: one wakeup of a process by another (a byte through a pipe and back) on the same
  core and across cores. Where the cores are virtual, a wakeup across them can cost a
  millisecond (a halted virtual CPU is woken through the hypervisor); every call above takes
  several such wakeups: the tails of "any" carry this cost, "split" for its API read only, and
  "one-core" not at all (it pays with one core for everything instead).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
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
from gpushare_sim.fakegpu.vendor import MPS_STAND_IN
from gpushare_sim.node.adapters.kube import SimKube
from gpushare_sim.run.kubeapi import ensure_namespace
from gpushare_sim.run.procs import http_text
from prometheus_client.parser import text_string_to_metric_families

from bench.deviceplugin.__main__ import collector_paused, rss_mb
from bench.procs import process
from bench.report import Row, emit, percentile
from tests.deviceplugin.stubs import VendorPluginStub
from tests.support.nats import NatsServer
from tests.support.service import http_env, http_port

PART = "dra"
NODE = "bench-dra-1"
CARDS = {f"GPU-{i}": "Healthy" for i in range(8)}
LIVE = 16  # claims prepared at any time (a busy node), the oldest unprepared as a new one comes


def driver_env(work: Path, nats_url: str, kubeconfig: Path) -> dict[str, str]:
    return {
        **os.environ, "GPUSHARE_NODE_NAME": NODE, "GPUSHARE_NATS_URL": nats_url,
        "GPUSHARE_NATS_ENSURE_LAYOUT": "true", "GPUSHARE_NATS_PREFIX": "bench.v1",
        "GPUSHARE_NATS_KV_PREFIX": "benchdra",
        **http_env(work / "ports"), "GPUSHARE_KUBE_KUBECONFIG": str(kubeconfig),
        "GPUSHARE_LOG_LEVEL": "WARNING", "GPUSHARE_DRA_REGISTRY_DIR": str(work / "registry"),
        "GPUSHARE_DRA_PLUGIN_DIR": str(work / "plugin"), "GPUSHARE_DRA_CDI_DIR": str(work / "cdi"),
        "GPUSHARE_DRA_DEVICE_PLUGIN_DIR": str(work), "GPUSHARE_DRA_VENDOR_SOCKETS": "nvidia.com/gpu=vendor.sock",
        "GPUSHARE_DRA_RUNTIME_CONFIG": str(work / "runtime.json"), "GPUSHARE_DRA_HOST_ROOT": str(work),
        "GPUSHARE_DRA_ISOLATION_DIR": str(work / "isolation"),
        "GPUSHARE_DRA_CARD_MEMORY_MIB": "nvidia.com/gpu=81920",
        # the built-in vendor table caps shares with MPS: the driver runs the sim's stand-in daemon
        "GPUSHARE_DRA_MPS_COMMAND": MPS_STAND_IN,
    }


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


def prepare_cycle(stub: Any, claims: list[pb.Claim]) -> tuple[list[float], list[float], list[float]]:
    prepare, again, unprepare = [], [], []
    live: list[pb.Claim] = []
    with collector_paused():
        for claim in claims:
            started = time.perf_counter()
            reply = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[claim]), timeout=10)
            prepare.append(time.perf_counter() - started)
            assert not reply.claims[claim.uid].error, reply.claims[claim.uid].error
            started = time.perf_counter()
            stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[claim]), timeout=10)
            again.append(time.perf_counter() - started)
            live.append(claim)
            if len(live) > LIVE:
                old = live.pop(0)
                started = time.perf_counter()
                stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=[old]), timeout=10)
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


def latency_rows(name: str, samples: list[float], target_p99_ms: float | None = None,
                 placement: str = "") -> list[Row]:
    p50, p99 = percentile(samples, 50) * 1e3, percentile(samples, 99) * 1e3
    target = f"<= {target_p99_ms} ms" if target_p99_ms else ""
    where = f", {placement}" if placement else ""
    return [Row(PART, f"{name} p50 (n={len(samples)}){where}", p50, "ms"),
            Row(PART, f"{name} p99 (n={len(samples)}){where}", p99, "ms", target,
                None if target_p99_ms is None else p99 <= target_p99_ms)]


def part_counts(metrics_url: str) -> dict[str, list[tuple[float, float]]]:
    """The driver's prepare parts: per part, cumulative (upper bound, count) of its histogram."""
    found: dict[str, list[tuple[float, float]]] = {}
    for family in text_string_to_metric_families(http_text(metrics_url)):
        if family.name != "gpushare_dra_prepare_part_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                found.setdefault(sample.labels["part"], []).append((float(sample.labels["le"]), sample.value))
    return {part: sorted(buckets) for part, buckets in found.items()}


def bucket_percentile(buckets: list[tuple[float, float]], p: float) -> float:
    """The ``p`` percentile of a cumulative histogram, linear within its bucket."""
    total = buckets[-1][1] if buckets else 0
    if not total:
        return float("nan")
    wanted, lower, below = total * p / 100, 0.0, 0.0
    for upper, count in buckets:
        if count >= wanted:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (wanted - below) / max(count - below, 1e-9)
        lower, below = upper, count
    return lower


def part_rows(before: dict[str, list[tuple[float, float]]], after: dict[str, list[tuple[float, float]]],
              placement: str) -> list[Row]:
    """The driver's own time and the claim's read, over the calls between two scrapes."""
    rows = []
    for part, name in (("driver", "its own time, without the claim's read"), ("claim_read", "the claim's read")):
        old = dict(before.get(part, []))
        buckets = [(le, count - old.get(le, 0.0)) for le, count in after.get(part, [])]
        for p in (50, 99):
            rows.append(Row(PART, f"NodePrepareResources, {name} p{p} (n={int(buckets[-1][1]) if buckets else 0}, "
                            f"driver histogram), {placement}", bucket_percentile(buckets, p) * 1e3, "ms"))
    return rows


def wakeups(first: int, second: int, rounds: int = 4000) -> list[float]:
    """Round trips of one byte between this process on CPU ``first`` and a child on ``second``
    (a pause now and then lets the CPUs go idle, as between a node's calls)."""
    there, here = os.pipe(), os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child echoes until told to stop
        os.sched_setaffinity(0, {second})
        while (byte := os.read(there[0], 1)) != b"q":
            os.write(here[1], byte)
        os._exit(0)
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {first})
    samples = []
    try:
        for index in range(rounds):
            started = time.perf_counter()
            os.write(there[1], b"x")
            os.read(here[0], 1)
            samples.append(time.perf_counter() - started)
            if index % 10 == 0:
                time.sleep(0.002)
    finally:
        os.write(there[1], b"q")
        os.waitpid(child, 0)
        os.sched_setaffinity(0, saved)
        for fd in (*there, *here):
            os.close(fd)
    return samples[100:]


def machine_rows() -> list[Row]:
    cpus = sorted(os.sched_getaffinity(0))
    rows = latency_rows("machine: process wakeup round trip, same core", wakeups(cpus[0], cpus[0]))
    rows = [Row(r.part, r.metric, r.value * 1e3, "us") for r in rows]
    if len(cpus) > 1:
        across = latency_rows("machine: process wakeup round trip, across cores", wakeups(cpus[0], cpus[-1]))
        rows += [Row(r.part, r.metric, r.value * 1e3, "us") for r in across]
    return rows


async def measure(args: argparse.Namespace, work: Path, nats: NatsServer, kubeconfig: Path,
                  placement: str) -> list[Row]:
    vendor = VendorPluginStub(str(work / "vendor.sock"), CARDS)
    await vendor.start()
    kube = SimKube.from_kubeconfig(str(kubeconfig))
    env = driver_env(work, nats.url, kubeconfig)
    try:
        claims = [await make_claim(kube, i) for i in range(args.claims)]
        with process([sys.executable, "-m", "gpushare_dra_driver"], env, log=work / "driver.log") as proc:
            deadline = time.monotonic() + 60
            while not (work / "plugin" / "dra.sock").exists() or not await kube.list_resource_slices():
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"the driver did not come up: {(work / 'driver.log').read_text()[-2000:]}")
                await asyncio.sleep(0.05)
            with grpc.insecure_channel(f"unix://{work / 'plugin' / 'dra.sock'}") as channel:
                stub = pb_grpc.DRAPluginStub(channel)
                prepare_cycle(stub, claims[:50])  # warm-up
                metrics_url = f"http://127.0.0.1:{http_port(work / 'ports', proc)}/metrics"
                before = part_counts(metrics_url)
                prepare, again, unprepare = prepare_cycle(stub, claims[50:])
                parts = part_rows(before, part_counts(metrics_url), placement)
            rows = latency_rows("NodePrepareResources, a claim of one shared device", prepare, 5, placement)
            rows += parts
            rows += latency_rows("NodePrepareResources, the claim already prepared", again, None, placement)
            rows += latency_rows("NodeUnprepareResources", unprepare, None, placement)
            await republish(kube, vendor, 10)  # warm-up
            rows += latency_rows("inventory change -> slice served by the API", await republish(
                kube, vendor, args.toggles), 50, placement)
            rss, _ = rss_mb(proc.pid)
            rows.append(Row(PART, f"driver RSS after the runs, {placement}", rss, "MB"))
        return rows
    finally:
        await kube.close()
        await vendor.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dra")
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--toggles", type=int, default=200)
    parser.add_argument("--placement", choices=("all", "one-core", "split", "any"), default="all",
                        help="one-core: every process on one CPU; split: the node's processes on one CPU, the "
                             "API emulator and NATS on another; any: where the scheduler puts them")
    args = parser.parse_args()
    args.claims = max(args.claims, 60)
    cpus = os.sched_getaffinity(0)
    placements = {"one-core": ({min(cpus)}, {min(cpus)}), "split": ({min(cpus)}, {max(cpus)}),
                  "any": (cpus, cpus)}
    if len(cpus) < 2:
        placements = {"any": (cpus, cpus)}
    rows: list[Row] = []
    for placement, (node, control) in placements.items():
        if args.placement not in ("all", placement):
            continue
        print(f"measuring with the node on CPUs {sorted(node)}, the control plane on {sorted(control)} "
              f"({placement})", file=sys.stderr, flush=True)
        try:
            rows += run_once(args, placement, node, control)
        finally:
            os.sched_setaffinity(0, cpus)
    rows += machine_rows()
    rows.append(Row(PART, "machine load average (1 min) at the end", os.getloadavg()[0], "runnable"))
    emit(rows)


def run_once(args: argparse.Namespace, placement: str, node: set[int], control: set[int]) -> list[Row]:
    """NATS and the API emulator (on the ``control`` CPUs), this process and the driver (on the
    ``node`` CPUs) started afresh; the rows of one placement. A child inherits the CPUs this
    process has when it starts it."""
    os.sched_setaffinity(0, control)
    nats = NatsServer().start()
    try:
        with tempfile.TemporaryDirectory(prefix="gpushare-bench-dra-", dir=tmpfs()) as tmp, \
                api_process(Path(tmp)) as kubeconfig:
            os.sched_setaffinity(0, node)
            return asyncio.run(measure(args, Path(tmp), nats, kubeconfig, placement))
    finally:
        nats.cleanup()


def tmpfs() -> str | None:
    """A tmpfs directory (the node's /var/run is one), else the default temporary directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@contextlib.contextmanager
def api_process(work: Path) -> Iterator[Path]:
    """The API emulator as its own process, with the namespace ``bench``; its kubeconfig."""
    kubeconfig = work / "kubeconfig"
    log = work / "apiserver.log"
    with process([sys.executable, "-m", "gpushare_sim.apiserver", "--kubeconfig", str(kubeconfig)], log=log) as proc:
        deadline = time.monotonic() + 30
        while not kubeconfig.exists():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the API emulator did not come up: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        ensure_namespace(kubeconfig, "bench")
        yield kubeconfig


if __name__ == "__main__":
    main()
