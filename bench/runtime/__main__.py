"""gpushare-runtime overhead on container create, in one run against plain runc.

  python -m bench.runtime [--cycles 40] [--siblings 200] [--baseline CHECKOUT]

Figures: the create+delete cycle through gpushare-runtime and through runc on
the same bundle with 200 sibling bundles on disk (same-pod reference, and a
signed cross-pod one), the paired overhead (median, min, max) and the ratio of
medians; the start-up of the interpreter and of a pass-through command; the
source lookup over the siblings, with and without the bundle index; a create
without gpushare annotations (the launcher's fast path).  With ``--baseline`` (the
root of another checkout, e.g. ``git worktree add /tmp/base HEAD~3``) that
checkout's runtime is installed too and takes part in the same alternation, so
before and after are measured in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpushare_common import ids
from gpushare_runtime.lookup import Identity, find_source

from bench.report import Row, emit, median
from bench.runtime import cycles
from tests.support.kubelet import Kubelet, serve_kubelet

REPO = Path(__file__).resolve().parents[2]


def install(bin_dir: Path, checkout: Path = REPO) -> str:
    script = checkout / "runtime" / "install" / "install.sh"
    subprocess.run([str(script), str(bin_dir), sys.executable], check=True, stdout=subprocess.DEVNULL)
    return str(bin_dir / "gpushare-runtime")


def ms(seconds: float) -> float:
    return seconds * 1000


def cycle_rows(label: str, samples: cycles.Samples, plain_samples: cycles.Samples) -> list[Row]:
    ours, plain = [s[0] for s in samples], [s[0] for s in plain_samples]
    overhead = [a - b for a, b in zip(ours, plain, strict=True)]
    ratio = median(ours) / median(plain)
    over = ms(median(overhead))
    cpu = [a[1] - b[1] for a, b in zip(samples, plain_samples, strict=True)]
    return [
        Row("runtime", f"{label}: runc create+delete median", ms(median(plain)), "ms"),
        Row("runtime", f"{label}: gpushare create+delete median", ms(median(ours)), "ms"),
        Row("runtime", f"{label}: overhead median", over, "ms", "<= 15", over <= 15),
        Row("runtime", f"{label}: overhead min", ms(min(overhead)), "ms"),
        Row("runtime", f"{label}: overhead max", ms(max(overhead)), "ms"),
        Row("runtime", f"{label}: ratio of medians", ratio, "ratio", "<= 1.15", ratio <= 1.15),
        Row("runtime", f"{label}: CPU time added per cycle, median", ms(median(cpu)), "ms"),
    ]


def lookup_rows(target: Path, index_dir: str) -> list[Row]:
    wanted = Identity("bench", "pod", "main")
    rows = []
    for label, directory in (("scan", None), ("index", index_dir)):
        find_source(str(target), wanted, directory)
        times = []
        for _ in range(50):
            start = time.perf_counter()
            assert find_source(str(target), wanted, directory) is not None
            times.append(time.perf_counter() - start)
        rows.append(Row("runtime", f"source lookup, 200 siblings, {label}", ms(median(times)), "ms"))
    return rows


def baseline_rows(label: str, samples: cycles.Samples, base: cycles.Samples,
                  plain: cycles.Samples) -> list[Row]:
    over = [a[0] - b[0] for a, b in zip(base, plain, strict=True)]
    cpu = [a[1] - b[1] for a, b in zip(base, plain, strict=True)]
    saved = [b[1] - a[1] for a, b in zip(samples, base, strict=True)]
    return [
        Row("runtime", f"{label}: baseline overhead median", ms(median(over)), "ms"),
        Row("runtime", f"{label}: baseline CPU time added per cycle, median", ms(median(cpu)), "ms"),
        Row("runtime", f"{label}: CPU time saved per cycle vs baseline, median", ms(median(saved)), "ms"),
    ]


NODE = "bench-node"
SHARE = "shadow-ns/shadow-0"  # the virtual device the kubelet allocated to the target (Allocate's JSON form)
SCENARIOS = {"same-pod": "_/_/main",
             "signed cross-pod": ids.format_devices_from({"shadow-ns/shadow/main": {"*": [SHARE]}}),
             "no annotation": ""}


def scenario(base: Path, args: argparse.Namespace, runtimes: list[str], label: str,
             kubelet: Kubelet) -> list[Row]:
    """One scenario; a signed cross-pod create asks the kubelet (a stand-in on a unix socket)."""
    key_file = base / "signing.key"
    key = os.urandom(32).hex().encode()
    key_file.write_bytes(key)
    key_file.chmod(0o600)
    config = base / "runtime.json"
    config.write_text(json.dumps({"key_file": str(key_file), "index_dir": str(base / "index"), "node_name": NODE,
                                  "shadow_namespace": "shadow-ns", "pod_resources_socket": str(kubelet.socket)}))
    kubelet.allocate("bench/pod", "dind", "gpushare/share-gpu-4", [SHARE])
    value = SCENARIOS[label]
    signed = label == "signed cross-pod"
    annotations = {cycles.ANNOTATION: value} if value else {}
    if signed:
        annotations[cycles.SIGNATURE] = ids.sign(key, ids.KIND_FROM, NODE, "*", value)
    target = cycles.build(base, args.siblings, annotations, "shadow-ns" if signed else "bench")
    env = {**os.environ, "GPUSHARE_RUNTIME_CONFIG": str(config)}
    samples = cycles.alternate_all([*runtimes, "runc"], target, args.cycles, env)
    ours, plain = samples[0], samples[-1]
    rows = cycle_rows(label, ours, plain)
    if len(samples) == 3:
        rows += baseline_rows(label, ours, samples[1], plain)
    return rows + lookup_rows(target, str(base / "index")) if label == "same-pod" else rows


def startup_rows(runtime: str) -> list[Row]:
    python = [sys.executable, "-I", "-S", "-c", "pass"]
    return [
        Row("runtime", "python -I -S start-up", ms(median(cycles.startup(python))), "ms"),
        Row("runtime", "runc --version", ms(median(cycles.startup(["runc", "--version"]))), "ms"),
        Row("runtime", "gpushare-runtime --version (pass-through)",
            ms(median(cycles.startup([runtime, "--version"]))), "ms"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.runtime")
    parser.add_argument("--cycles", type=int, default=40)
    parser.add_argument("--siblings", type=int, default=200)
    parser.add_argument("--baseline", type=Path, help="another checkout to compare with")
    args = parser.parse_args()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
        runtimes = [install(Path(tmp) / "bin")]
        if args.baseline:
            runtimes.append(install(Path(tmp) / "baseline", args.baseline.resolve()))
        with serve_kubelet() as kubelet:
            for index, label in enumerate(SCENARIOS):
                base = Path(tmp) / f"scenario-{index}"
                base.mkdir()
                rows += scenario(base, args, runtimes, label, kubelet)
        rows += startup_rows(runtimes[0])
    emit(rows)


if __name__ == "__main__":
    main()
