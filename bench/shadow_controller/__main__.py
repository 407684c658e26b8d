"""One reconcile pass over 10,000 pods with 1,000 ShadowPods: CPU time, and the process's memory.

  python -m bench.shadow_controller [--pods 10000] [--shadows 1000]

Pods are classified from API-shaped dicts exactly as the watch delivers them;
the pass is the controller's pure planning step (no API writes).
"""

from __future__ import annotations

import argparse
import gc
import time

from gpushare_common.adapters.kube import PodChange
from gpushare_shadow_controller.controller import Controller
from gpushare_shadow_controller.settings import ShadowSettings
from prometheus_client import CollectorRegistry

from bench.report import Row, emit, median


def make_pods(pods: int, shadows: int) -> list[dict[str, object]]:
    items: list[dict[str, object]] = []
    for i in range(shadows):
        items.append({
            "metadata": {"namespace": f"ns{i % 20}", "name": f"shadow-{i}",
                         "labels": {"gpushare.k8s.io/pod-description": "shadow-pod"},
                         "annotations": {"gpushare.k8s.io/share-kind": "share",
                                         "gpushare.k8s.io/share-spec": "4"},
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": f"node-{i % 250}",
                     "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}})
    for i in range(pods - shadows):
        share = i % 3 == 0
        resources = {"gpushare/share-gpu-4": "1"} if share else {"cpu": "1", "memory": "1Gi"}
        owner = f"ns{(i // 4) % 20}/shadow-{(i // 4) % shadows}" if share and i % 2 else ""
        items.append({
            "metadata": {"namespace": f"ns{(i // 4) % 20}", "name": f"pod-{i}",
                         "annotations": {"gpushare.k8s.io/device-owner": owner} if owner else {},
                         "labels": {"app": "x"}},
            "spec": {"nodeName": "" if i % 7 == 0 else f"node-{i % 250}",
                     "containers": [{"name": "c", "image": "x", "resources": {"requests": resources}}]},
            "status": {"phase": "Pending" if i % 7 == 0 else "Running"}})
    return items


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.shadow_controller")
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--shadows", type=int, default=1_000)
    parser.add_argument("--passes", type=int, default=20)
    args = parser.parse_args()
    import gpushare_shadow_controller.app  # noqa: F401  (the service's full import set)

    base_mb = rss_mb()
    controller = Controller(None, ShadowSettings(), CollectorRegistry(), lambda: True)  # type: ignore[arg-type]
    pods = make_pods(args.pods, args.shadows)
    start = time.process_time()
    controller.apply(PodChange("SYNC", pods=pods))
    sync_ms = (time.process_time() - start) * 1000
    del pods
    gc.collect()
    samples = []
    for _ in range(args.passes):
        start = time.process_time()
        controller.decide()
        samples.append((time.process_time() - start) * 1000)
    held_mb = rss_mb()
    pass_ms = median(samples)
    emit([
        Row("shadow-controller", f"classify {args.pods} pods (SYNC)", sync_ms, "ms CPU"),
        Row("shadow-controller", f"reconcile pass, {args.pods} pods / {args.shadows} ShadowPods",
            pass_ms, "ms CPU", "<= 200", pass_ms <= 200),
        Row("shadow-controller", "reconcile pass max", max(samples), "ms CPU"),
        Row("shadow-controller", "RSS, libraries imported, no pods", base_mb, "MB"),
        Row("shadow-controller", f"RSS holding {args.pods} pod records", held_mb, "MB", "<= 100",
            held_mb <= 100),
    ])


if __name__ == "__main__":
    main()
