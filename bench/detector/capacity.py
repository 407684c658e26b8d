"""Spare-capacity computation for a node with 200 pods (a cgroup v2 tree in a temporary directory)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from gpushare_detector.adapters.cgroups import read_node, read_pods
from gpushare_detector.capacity import Policy
from gpushare_detector.capacity_service import Snapshot, compute

from bench.report import Row, median


def make_tree(root: Path, pods: int, tick: int) -> None:
    (root / "cgroup.controllers").write_text("cpu memory\n")
    for i in range(pods):
        qos = ("burstable", "besteffort")[i % 2]
        directory = root / "kubepods.slice" / f"kubepods-{qos}.slice" / \
            f"kubepods-{qos}-pod{i:08x}_0000_0000_0000_{i:012x}.slice"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cpu.stat").write_text(f"usage_usec {(i + 1) * 1000 * tick}\nuser_usec 1\nsystem_usec 1\n")
        (directory / "memory.current").write_text(f"{(i + 1) << 20}\n")
        (directory / "memory.stat").write_text("anon 1\nfile 2\ninactive_file 4096\nactive_file 1\n")


def capacity_rows(part: str, pods: int = 200, rounds: int = 20) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="bench-cgroups-") as tmp:
        root = Path(tmp)
        make_tree(root, pods, 1)
        batch = {f"{i:08x}-0000-0000-0000-{i:012x}" for i in range(0, pods, 4)}
        previous = Snapshot(0.0, read_node(Path("/proc")), read_pods(root))
        make_tree(root, pods, 2)
        full, pure = [], []
        for _ in range(rounds):
            start = time.process_time()
            snapshot = Snapshot(10.0, read_node(Path("/proc")), read_pods(root))
            middle = time.process_time()
            result = compute(previous, snapshot, batch, Policy())
            end = time.process_time()
            full.append((end - start) * 1000)
            pure.append((end - middle) * 1000)
        assert len(snapshot.pods.pods) == pods and result["vcpu"].inputs["pods"] == pods
    return [
        Row(part, f"spare capacity, {pods} pods: read cgroups + compute, CPU median", median(full), "ms",
            "<= 20", median(full) <= 20),
        Row(part, f"spare capacity, {pods} pods: compute only, CPU median", median(pure), "ms"),
    ]
