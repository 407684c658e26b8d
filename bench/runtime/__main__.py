"""gpushare-runtime overhead on container create, in one run against plain runc.

  python -m bench.runtime [--cycles 40] [--siblings 200]

Figures: the create+delete cycle through gpushare-runtime and through runc on
the same bundle with 200 sibling bundles on disk (same-pod reference, and a
signed cross-pod one), the paired overhead (median, min, max) and the ratio of
medians; the start-up of the interpreter and of a pass-through command; the
source lookup over the siblings, with and without the bundle index.
"""

from __future__ import annotations

import argparse
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

REPO = Path(__file__).resolve().parents[2]


def install(bin_dir: Path) -> str:
    subprocess.run([str(REPO / "runtime" / "install" / "install.sh"), str(bin_dir)], check=True,
                   stdout=subprocess.DEVNULL)
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


def scenario(base: Path, args: argparse.Namespace, runtime: str, signed: bool) -> list[Row]:
    key_file = base / "signing.key"
    key = os.urandom(32).hex().encode()
    key_file.write_bytes(key)
    key_file.chmod(0o600)
    config = base / "runtime.json"
    config.write_text(f'{{"key_file": "{key_file}", "index_dir": "{base / "index"}"}}\n')
    value = "shadow-ns/shadow/main" if signed else "_/_/main"
    annotations = {cycles.ANNOTATION: value}
    if signed:
        annotations[cycles.SIGNATURE] = ids.sign(key, "*", value)
    target = cycles.build(base, args.siblings, annotations, "shadow-ns" if signed else "bench")
    env = {**os.environ, "GPUSHARE_RUNTIME_CONFIG": str(config)}
    ours, plain = cycles.alternate(runtime, target, args.cycles, env)
    rows = cycle_rows("signed cross-pod" if signed else "same-pod", ours, plain)
    return rows if signed else rows + lookup_rows(target, str(base / "index"))


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
    args = parser.parse_args()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
        runtime = install(Path(tmp) / "bin")
        for signed in (False, True):
            base = Path(tmp) / ("signed" if signed else "same-pod")
            base.mkdir()
            rows += scenario(base, args, runtime, signed)
        rows += startup_rows(runtime)
    emit(rows)


if __name__ == "__main__":
    main()
