from __future__ import annotations

from pathlib import Path

import pytest
from gpushare_detector.adapters.cgroups import read_node, read_pods
from gpushare_detector.capacity import Inputs, Policy, should_publish, spare
from gpushare_detector.cgroupstats import StatsError, Usage, flat_keyed, node_stats, pod_uid, usage_v1, usage_v2
from hypothesis import given
from hypothesis import strategies as st

MIB = 1 << 20
UID = "0f3c2a5e-1b2c-4d5e-8f90-a1b2c3d4e5f6"
UID2 = "11111111-2222-3333-4444-555555555555"


@pytest.mark.parametrize(
    ("inputs", "margin", "amount", "devices"),
    [
        # 8 cores, 10% margin, system 500m over reserved 200m, ordinary pods 2000m
        (Inputs(8000, 3000, 2500, 2000, 200), 0.1, 8000 - 800 - 500 - 2000, 47),
        # reserved dominates system used
        (Inputs(8000, 2600, 2500, 2500, 1000), 0.1, 8000 - 800 - 1000 - 2500, 37),
        # batch pods' usage (pods_used - ordinary_used) does not shrink spare capacity
        (Inputs(8000, 6000, 5900, 1000, 0), 0.0, 8000 - 100 - 1000, 69),
        # overcommitted: never negative
        (Inputs(4000, 4000, 3900, 3900, 0), 0.1, 0, 0),
    ],
)
def test_cpu_formula(inputs: Inputs, margin: float, amount: float, devices: int) -> None:
    found = spare("vcpu", inputs, margin)
    assert found.amount == pytest.approx(amount)
    assert (found.devices, found.unit) == (devices, 100)
    assert found.inputs["system_used"] == inputs.system_used


def test_memory_formula_units() -> None:
    found = spare("vmem", Inputs(16384 * MIB, 4096 * MIB, 3072 * MIB, 2048 * MIB, 512 * MIB), 0.0)
    # 16384 - max(1024, 512) - 2048 = 13312 MiB = 52 devices of 256 MiB
    assert (found.devices, found.unit) == (52, 256 * MIB)


@pytest.mark.parametrize(
    ("previous", "current", "age", "expected"),
    [(None, 5, 0, True), (100, 109, 10, False), (100, 111, 10, True), (100, 89, 10, True),
     (100, 100, 300, True), (0, 0, 10, False), (0, 1, 10, True), (10, 0, 10, True)],
)
def test_publish_on_change_above_ten_percent_or_every_five_minutes(
        previous: int | None, current: int, age: float, expected: bool) -> None:
    assert should_publish(previous, current, age, Policy()) is expected


def test_parsers() -> None:
    usage = usage_v2("usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n", "1048576\n",
                     "anon 100\ninactive_file 262144\nactive_file 7\n")
    assert usage == Usage(1_500_000, 786432)
    assert usage_v1("123456789\n", "2097152\n", "cache 1\ntotal_inactive_file 1048576\n") == Usage(
        123456789, 1048576)
    assert pod_uid(f"kubepods-burstable-pod{UID.replace('-', '_')}.slice") == UID
    assert pod_uid(f"pod{UID}") == UID
    assert pod_uid("kubepods-burstable.slice") is None
    stats = node_stats("cpu  100 0 50 1000 20 5 5 0 0 0\ncpu0 1 1 1 1 1 1 1 1\ncpu1 1 1 1 1 1 1 1 1\n",
                       "MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 600 kB\n")
    assert (stats.cpus, stats.cpu_busy_ns, stats.memory_total, stats.memory_used) == (
        2, 160 * 10_000_000, 1000 * 1024, 400 * 1024)


@pytest.mark.parametrize(
    "call",
    [lambda: usage_v2("user_usec 1\n", "1", ""), lambda: usage_v2("usage_usec x\n", "1", ""),
     lambda: usage_v1("-5", "1", ""), lambda: usage_v1("1", "1", "a b c\n"),
     lambda: node_stats("intr 1 2\n", "MemTotal: 1 kB\nMemAvailable: 1 kB\n"),
     lambda: node_stats("cpu 1 1 1 1\ncpu0 1\n", "MemTotal: 1 kB\n")],
)
def test_bad_statistics_are_typed_errors(call: object) -> None:
    with pytest.raises(StatsError):
        call()  # type: ignore[operator]


@given(st.text(max_size=120))
def test_flat_keyed_parses_or_raises_stats_error(text: str) -> None:
    try:
        flat_keyed("memory.stat", text)
    except StatsError:
        pass


def _write(directory: Path, files: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)


def test_cgroup_v2_tree(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    slice_dir = tmp_path / "kubepods.slice" / "kubepods-burstable.slice"
    v2 = {"cpu.stat": "usage_usec 2000000\n", "memory.current": "104857600\n",
          "memory.stat": "inactive_file 4857600\n"}
    _write(slice_dir / f"kubepods-burstable-pod{UID.replace('-', '_')}.slice", v2)
    _write(tmp_path / "kubepods.slice" / f"kubepods-pod{UID2.replace('-', '_')}.slice",
           {"cpu.stat": "garbage\n"})
    found = read_pods(tmp_path)
    assert found.version == 2
    assert found.pods == {UID: Usage(2_000_000_000, 100_000_000)}
    assert UID2 in found.errors


def test_cgroup_v1_tree(tmp_path: Path) -> None:
    _write(tmp_path / "cpu,cpuacct" / "kubepods" / "besteffort" / f"pod{UID}", {"cpuacct.usage": "5000\n"})
    _write(tmp_path / "memory" / "kubepods" / "besteffort" / f"pod{UID}",
           {"memory.usage_in_bytes": "3000\n", "memory.stat": "total_inactive_file 1000\n"})
    found = read_pods(tmp_path)
    assert (found.version, found.pods, found.errors) == (1, {UID: Usage(5000, 2000)}, {})


def test_this_machines_real_cgroups_and_proc() -> None:
    root = Path("/sys/fs/cgroup")
    if not root.is_dir():
        pytest.skip("no cgroup filesystem mounted at /sys/fs/cgroup")
    found = read_pods(root)
    assert found.version in (1, 2)
    assert not found.errors
    node = read_node(Path("/proc"))
    assert node.cpus >= 1 and 0 < node.memory_used < node.memory_total
    own = _own_usage(root, found.version)
    assert own.memory > 0 and own.cpu_ns > 0


def _own_usage(root: Path, version: int) -> Usage:
    """This test process's own cgroup, read with the same parsers."""
    lines = [line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()]
    paths = {c: p.lstrip("/") for _, cs, p in lines for c in cs.split(",")}
    if version == 2:
        directory = root / paths[""]
        return usage_v2(*(directory.joinpath(n).read_text() for n in ("cpu.stat", "memory.current",
                                                                       "memory.stat")))
    cpu = next(root / d / paths["cpuacct"] for d in ("cpuacct", "cpu,cpuacct") if (root / d).is_dir())
    memory = root / "memory" / paths["memory"]
    return usage_v1((cpu / "cpuacct.usage").read_text(), (memory / "memory.usage_in_bytes").read_text(),
                    (memory / "memory.stat").read_text())
