"""Benchmark of the API emulator at cluster scale, with the official client.

  python -m gpushare_sim.apiserver.bench [--pods 10000] [--nodes 100] [--patches 2000]

The emulator runs in its own process (as in the local cluster). Figures:
create throughput, list latency (all pods; as kubectl's Table; by node with a
field selector; by label), and watch fan-out: one watcher per node plus one for every pod, while
pods are patched, with one watcher that never reads (it must not slow the
writers; it is dropped with 410 once its queue is full).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
from kubernetes import client, config

from gpushare_sim.run.procs import wait_ports

Figures = list[tuple[str, float, str]]  # (metric, value, unit)
_TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"  # what kubectl get asks for


@contextlib.contextmanager
def emulator_process(directory: Path, watch_queue: int) -> Iterator[tuple[str, Path]]:
    kubeconfig = directory / "kubeconfig"
    command = [sys.executable, "-m", "gpushare_sim.apiserver", "--port", "0", "--ports-dir", str(directory),
               "--kubeconfig", str(kubeconfig), "--history", "100000",
               "--watch-queue", str(watch_queue)]
    process = subprocess.Popen(command)
    try:
        url = wait_ports(directory, process, timeout=20)["api"][0]
        _wait_healthy(url, process)
        yield url, kubeconfig
    finally:
        process.terminate()
        process.wait(10)


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/healthz", timeout=1) as answer:
            if answer.status == 200:
                return
        time.sleep(0.05)  # polling a process we just started; nothing to wait on instead
    raise RuntimeError(f"the API emulator at {url} did not become healthy")


def _pod(index: int, nodes: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"pod-{index}", "labels": {"app": f"app-{index % 10}"},
                     "annotations": {"gpushare.k8s.io/share-spec": "4"}},
        "spec": {"nodeName": f"node-{index % nodes}",
                 "containers": [{"name": "main", "image": "busybox",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }


def _timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def bench_writes_and_lists(core: Any, pods: int, nodes: int) -> Figures:
    start = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: core.create_namespaced_pod(
            "bench", _pod(i, nodes), _preload_content=False).data, range(pods)))
    rate = pods / (time.perf_counter() - start)

    def raw_list(decode: bool = True, **selectors: str) -> Callable[[], Any]:
        def fetch() -> Any:
            body = core.list_pod_for_all_namespaces(_preload_content=False, **selectors).data
            return msgspec.json.decode(body) if decode else body

        return fetch

    fetched = _timed(raw_list(decode=False), 5)
    everything = _timed(raw_list(), 5)
    by_node = _timed(raw_list(field_selector=f"spec.nodeName=node-{nodes // 2}"), 20)
    by_label = _timed(raw_list(label_selector="app=app-3"), 10)
    typed = _timed(lambda: core.list_pod_for_all_namespaces(), 1)
    table = _timed(lambda: core.list_pod_for_all_namespaces(_preload_content=False,
                                                            _headers={"Accept": _TABLE}).data, 5)  # fmt: skip
    return [
        ("create pods (4 client threads)", rate, "pods/s"),
        (f"list {pods} pods, response bytes only, median", statistics.median(fetched), "ms"),
        (f"list {pods} pods, decoded with msgspec, median", statistics.median(everything), "ms"),
        (f"list {pods} pods into client models", typed[0], "ms"),
        (f"list {pods} pods as a Table (kubectl get), median", statistics.median(table), "ms"),
        ("list one node's pods (fieldSelector), median", statistics.median(by_node), "ms"),
        ("list 10% of pods (labelSelector), median", statistics.median(by_label), "ms"),
    ]


async def _watch_reader(url: str, path: str, expected: int, counts: list[int], slot: int) -> None:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    await reader.readuntil(b"\r\n\r\n")
    try:
        while counts[slot] < expected:
            size = int((await reader.readline()).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            counts[slot] += chunk.count(b"\n") - 1
    finally:
        writer.close()


async def _stalled(url: str, path: str) -> asyncio.StreamWriter:
    host, port = url.removeprefix("http://").split(":")
    _reader, writer = await asyncio.open_connection(host, int(port), limit=1024)
    writer.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    return writer  # never read from


def _patch_all(core: Any, patches: int) -> list[float]:
    def one(index: int) -> float:
        body = {"metadata": {"annotations": {"bench": str(index)}}}
        start = time.perf_counter()
        core.patch_namespaced_pod(f"pod-{index}", "bench", body, _preload_content=False).read()
        return (time.perf_counter() - start) * 1000

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, range(patches)))


async def bench_watch(url: str, core: Any, nodes: int, patches: int) -> Figures:
    version = json.loads(core.list_namespaced_pod("bench", limit=1, _preload_content=False).data)
    since = version["metadata"]["resourceVersion"]
    base = f"/api/v1/namespaces/bench/pods?watch=1&resourceVersion={since}"
    paths = [f"{base}&fieldSelector=spec.nodeName%3Dnode-{n}" for n in range(nodes)] + [base]
    expected = [len(range(n, patches, nodes)) for n in range(nodes)] + [patches]
    counts = [0] * len(paths)
    stalled = await _stalled(url, base)
    readers = [asyncio.create_task(_watch_reader(url, p, e, counts, i))
               for i, (p, e) in enumerate(zip(paths, expected, strict=True))]
    start = time.perf_counter()
    latencies = await asyncio.to_thread(_patch_all, core, patches)
    await asyncio.wait_for(asyncio.gather(*readers), 120)
    elapsed = time.perf_counter() - start
    stalled.close()
    delivered = sum(expected)
    return [
        (f"watch fan-out: {len(paths)} watchers + 1 stalled, events delivered", delivered / elapsed,
         "events/s"),
        ("patch latency during fan-out, p50", statistics.median(latencies), "ms"),
        ("patch latency during fan-out, p99", sorted(latencies)[int(len(latencies) * 0.99) - 1], "ms"),
    ]


def run(pods: int = 10_000, nodes: int = 100, patches: int = 2_000) -> Figures:
    with tempfile.TemporaryDirectory(prefix="apiserver-bench-") as directory, \
            emulator_process(Path(directory), watch_queue=1_000) as (url, kubeconfig):
        api = config.new_client_from_config(config_file=str(kubeconfig))
        core: Any = client.CoreV1Api(api)  # raw responses (_preload_content=False)
        core.create_namespace({"metadata": {"name": "bench"}}, _preload_content=False).read()
        figures = bench_writes_and_lists(core, pods, nodes)
        figures += asyncio.run(bench_watch(url, core, nodes, min(patches, pods)))
        api.close()
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--patches", type=int, default=2_000)
    args = parser.parse_args()
    for metric, value, unit in run(args.pods, args.nodes, args.patches):
        print(f"{metric:<60} {value:>12,.1f} {unit}")


if __name__ == "__main__":
    main()
