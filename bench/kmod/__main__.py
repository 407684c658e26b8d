"""gpushare kernel module in qemu (software emulation), two boots.

  python -m bench.kmod [--calls 20000] [--rounds 3] [--releases 200]

1. Cost of a non-watched ioctl from a new pid namespace, module loaded vs
   not loaded, alternating load/unload ``rounds`` times in the same boot.
   This boot runs with ``qemu -icount shift=0``: guest time counts
   instructions executed (1 ns = 1 instruction), so the figures do not move
   with the host's load. Cases: an ioctl type that is not watched on
   /dev/null from a namespace in container_map (the cheapest ioctl there
   is: ENOTTY at once), TCGETS on a pseudo-terminal (a typical non-GPU
   ioctl), and the watched type from a namespace not in container_map.
2. Release -> unblock latency in real (wall-clock) guest time: the owner's
   ioctl blocks in detect mode, the notice arrives, RELEASE is sent, the
   ioctl returns; p50 / p99. (Wall-clock loop ratios are not reported: under
   software emulation on a shared machine they vary by tens of percent
   between identical runs.)
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from bench.report import Row, emit, median
from tests.kmod import vm

# name: (ioctl type for `kmodctl loop`, 0 = TCGETS on a pty; in container_map when loaded)
CASES = {
    "null": (0x54, 1),
    "tty": (0, 1),
    "watched_unmapped": (0x46, 0),
}
LABELS = {
    "null": "non-watched ioctl on /dev/null",
    "tty": "TCGETS on a pty",
    "watched_unmapped": "watched type, pidns not in map",
}


def _loop(label: str, type_: int, calls: int, mapped: int) -> str:
    return f"/kmodctl loop {type_} {calls} {mapped} | sed 's/^RESULT loop/RESULT {label}/'\n"


def loops_script(calls: int, rounds: int) -> str:
    lines = []
    for i in range(rounds):
        lines += [_loop(f"r{i}_off_{case}", t, calls, 0) for case, (t, _) in CASES.items()]
        lines.append("insmod /gpushare.ko\n")
        lines += [_loop(f"r{i}_on_{case}", t, calls, m) for case, (t, m) in CASES.items()]
        lines.append("rmmod gpushare\n")
    return "".join(lines)


def release_script(releases: int) -> str:
    return f"insmod /gpushare.ko\n/kmodctl release {releases}\nrmmod gpushare\n"


def loop_samples(results: dict[str, dict[str, str]]) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = defaultdict(list)
    for name, values in results.items():
        if name.startswith("r") and "ns_per_call" in values:
            samples[name.split("_", 1)[1]].append(float(values["ns_per_call"]))
    return samples


def ratio_rows(results: dict[str, dict[str, str]]) -> list[Row]:
    samples = loop_samples(results)
    rows = []
    for case, label in LABELS.items():
        off, on = median(samples[f"off_{case}"]), median(samples[f"on_{case}"])
        rows.append(Row("kmod", f"{label}: unloaded", off, "instr/call"))
        rows.append(Row("kmod", f"{label}: loaded", on, "instr/call"))
        ok = on / off <= 1.10 if case != "watched_unmapped" else None
        rows.append(Row("kmod", f"{label}: loaded/unloaded", on / off, "x",
                        "<= 1.10" if ok is not None else "", ok))
    return rows


def release_rows(results: dict[str, dict[str, str]]) -> list[Row]:
    release = results["release"]
    return [
        Row("kmod", "release->unblock p50", float(release["p50_us"]), "us"),
        Row("kmod", "release->unblock p99", float(release["p99_us"]), "us"),
        Row("kmod", "ioctl->notice received p50", float(release["notice_p50_us"]), "us"),
        Row("kmod", "release rounds", float(release["rounds"]), ""),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.kmod", description="gpushare kernel module")
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--releases", type=int, default=200)
    args = parser.parse_args()
    module, tool = vm.build_kmod(vm.find_guest_kernel())
    files = {"/gpushare.ko": module, "/kmodctl": tool}
    counted = vm.run_guest(loops_script(args.calls, args.rounds), files,
                           vm.VMOptions(timeout_s=600, icount=True))
    timed = vm.run_guest(release_script(args.releases), files, vm.VMOptions(timeout_s=600))
    emit(ratio_rows(counted.results()) + release_rows(timed.results()))


if __name__ == "__main__":
    main()
