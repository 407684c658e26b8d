"""Create+delete cycles through gpushare-runtime and through plain runc, on the same bundle.

A temporary directory holds ``siblings`` bundles of other pods (the node's
other containers), a source container ``bench/pod/main`` with a device, and
the target bundle whose spec copies it.  Each round restores the target's
original config.json (untimed: containerd hands every create a fresh bundle),
then times ``create`` + ``delete -f`` through gpushare-runtime and through
runc, alternating which goes first.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

ANNOTATION = "gpushare.k8s.io/container-devices-from.*"
SIGNATURE = "gpushare.k8s.io/signature-from.*"


def base_spec(rootfs: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as bundle:
        subprocess.run(["runc", "spec", "--bundle", bundle], check=True)
        spec: dict[str, Any] = json.loads(Path(bundle, "config.json").read_text())
    spec["process"]["terminal"] = False
    spec["process"]["args"] = ["/bin/sleep", "10"]
    spec["root"] = {"path": str(rootfs), "readonly": True}
    return spec


def with_identity(spec: dict[str, Any], namespace: str, pod: str, container: str) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(spec))
    copy["annotations"] = {
        "io.kubernetes.cri.sandbox-namespace": namespace,
        "io.kubernetes.cri.sandbox-name": pod,
        "io.kubernetes.cri.container-name": container,
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.sandbox-id": os.urandom(32).hex(),
    }
    return copy


def write_bundle(bundle: Path, spec: dict[str, Any]) -> None:
    bundle.mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps(spec, separators=(",", ":")))


def build(base: Path, siblings: int, annotations: dict[str, str], source_ns: str) -> Path:
    """Siblings, the source and the target bundle under ``base``; returns the target."""
    rootfs = base / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy2(shutil.which("busybox") or "/bin/busybox", rootfs / "bin" / "busybox")
    (rootfs / "bin" / "sleep").symlink_to("busybox")
    spec = base_spec(rootfs)
    bundles = base / "bundles"
    for index in range(siblings):
        write_bundle(bundles / f"{index:064x}", with_identity(spec, "bench", f"other-{index}", "main"))
    source = with_identity(spec, source_ns, "pod" if source_ns == "bench" else "shadow", "main")
    source["linux"]["devices"] = [{"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 3,
                                   "fileMode": 438, "uid": 0, "gid": 0}]
    source["linux"]["resources"]["devices"].append(
        {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"})
    source["process"]["env"].append("NVIDIA_VISIBLE_DEVICES=GPU-0")
    write_bundle(bundles / "source", source)
    target = with_identity(spec, "bench", "pod", "dind")
    target["annotations"].update(annotations)
    write_bundle(bundles / "target", target)
    return bundles / "target"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cycle(binary: str, root: Path, bundle: Path, log: Path, name: str,
          env: dict[str, str]) -> tuple[float, float]:
    """Wall-clock and CPU seconds (of the runtime processes) of one create+delete."""
    flags = ["--root", str(root), "--log", str(log), "--log-format", "json"]
    cpu, start = _children_cpu(), time.perf_counter()
    subprocess.run([binary, *flags, "create", "--bundle", str(bundle), name], check=True, env=env,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([binary, *flags, "delete", "-f", name], check=True, env=env)
    return time.perf_counter() - start, _children_cpu() - cpu


Samples = list[tuple[float, float]]


def alternate_all(binaries: list[str], bundle: Path, cycles: int, env: dict[str, str],
                  warmup: int = 3) -> list[Samples]:
    """Samples of (wall, cpu) seconds per cycle for each binary, paired by round; the
    order rotates every round so that none is always first."""
    original = (bundle / "config.json").read_bytes()
    base = bundle.parent.parent
    results: list[Samples] = [[] for _ in binaries]
    for index in range(cycles + warmup):
        shift = index % len(binaries)
        for which in [*range(shift, len(binaries)), *range(shift)]:
            (bundle / "config.json").write_bytes(original)
            sample = cycle(binaries[which], base / "state", bundle, base / "runtime.log",
                           f"bench-{index}-{which}", env)
            if index >= warmup:
                results[which].append(sample)
    return results


def alternate(runtime: str, bundle: Path, cycles: int, env: dict[str, str],
              warmup: int = 3) -> tuple[Samples, Samples]:
    """(gpushare, runc) samples of (wall, cpu) seconds per cycle, paired."""
    ours, plain = alternate_all([runtime, "runc"], bundle, cycles, env, warmup)
    return ours, plain


def startup(command: list[str], rounds: int = 30) -> list[float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        subprocess.run(command, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return times
