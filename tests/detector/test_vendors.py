from __future__ import annotations

import math
from pathlib import Path

import pytest
from gpushare_detector.gpumetrics import ScrapeError, device_metrics, scrape_metrics
from gpushare_detector.scraper import ScrapeResult
from gpushare_detector.vendors import BUILTIN_DIR, MappingError, load_mappings, parse_mapping
from hypothesis import given
from hypothesis import strategies as st

FIXTURES = Path(__file__).parent / "fixtures"
MAPPINGS = load_mappings(BUILTIN_DIR)
GIB = 1 << 30
# every shipped fixture describes the same two cards: a busy one used by dev/alice, an idle free one
DEVICES = {
    "nvidia-dcgm": ("GPU-aaaa", "GPU-bbbb"),
    "hygon-dcu": ("0000:41:00.0", "0000:42:00.0"),
    "metax": ("GPU-aaaa", "GPU-bbbb"),
    "huawei-ascend": ("GPU-aaaa", "GPU-bbbb"),
    "enflame": ("GPU-aaaa", "GPU-bbbb"),
    "kunlunxin": ("GPU-aaaa", "GPU-bbbb"),
    "iluvatar": ("GPU-aaaa", "GPU-bbbb"),
}


def test_every_shipped_vendor_has_a_fixture() -> None:
    assert set(MAPPINGS) == set(DEVICES)
    assert {p.stem for p in FIXTURES.glob("*.prom")} >= set(DEVICES)


@pytest.mark.parametrize("vendor", sorted(DEVICES))
def test_vendor_fixture(vendor: str) -> None:
    text = (FIXTURES / f"{vendor}.prom").read_text()
    devices, problems = device_metrics(MAPPINGS[vendor], text)
    busy_id, idle_id = DEVICES[vendor]
    assert set(devices) == {busy_id, idle_id}
    assert not problems
    busy, idle = devices[busy_id], devices[idle_id]
    assert (busy.utilisation, busy.memory_used, busy.power) == (37, 2 * GIB, 250.5)
    assert busy.memory_total == 8 * GIB
    assert (busy.namespace, busy.pod, busy.container) == ("dev", "alice", "main")
    assert (idle.utilisation, idle.memory_used, idle.memory_total, idle.power) == (0, 0, 8 * GIB, 61)
    assert (idle.pod, idle.namespace) == ("", "")


def test_a_new_vendor_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "acme.yaml").write_text(
        "vendor: acme\nmetrics:\n  utilisation: {names: [acme_busy_ratio], scale: 100}\n"
        "labels:\n  device: [card]\n  pod: [owner]\n")
    mappings = load_mappings(BUILTIN_DIR, tmp_path)
    assert set(mappings) == set(DEVICES) | {"acme"}
    devices, _ = device_metrics(mappings["acme"], 'acme_busy_ratio{card="c0",owner="p"} 0.25\n')
    assert devices["c0"].utilisation == 25.0 and devices["c0"].pod == "p"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("vendor: x\nmetrics: {utilisation: {names: [u]}}\nlabels: {}\n", "required"),
        ("vendor: x\nmetrics: {utilisation: {names: []}}\nlabels: {device: [d]}\n", "non-empty"),
        ("vendor: x\nmetrics: {utilisation: {names: [u], scale: -1}}\nlabels: {device: [d]}\n", "positive"),
        ("vendor: x\nmetrics: {heat: {names: [u]}}\nlabels: {device: [d]}\n", "unknown metrics"),
        ("vendor: x\nmetrics: [1]\nlabels: {device: [d]}\n", "'metrics' must be a mapping"),
        ("- just a list\n", "'vendor'"),
        ("vendor: [unclosed\n", "not YAML"),
    ],
)
def test_bad_mapping_is_a_typed_error(text: str, reason: str) -> None:
    with pytest.raises(MappingError, match=reason):
        parse_mapping(text, "test.yaml")


DCGM = MAPPINGS["nvidia-dcgm"]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('DCGM_FI_DEV_GPU_UTIL{gpu="",Hostname="n"} 5', "missing-label"),
        ('DCGM_FI_DEV_GPU_UTIL{UUID="G1"} NaN', "not-finite"),
        ('DCGM_FI_DEV_GPU_UTIL{UUID="G1"} +Inf', "not-finite"),
        ('DCGM_FI_DEV_GPU_UTIL{UUID="G1"} -1', "out-of-range"),
        ('DCGM_FI_DEV_GPU_UTIL{UUID="G1"} 250', "out-of-range"),
    ],
)
def test_garbage_samples_are_counted_and_never_zero(line: str, problem: str) -> None:
    devices, problems = device_metrics(DCGM, line + '\nDCGM_FI_DEV_FB_USED{UUID="G1"} 1\n')
    assert problems == {problem: 1}
    assert devices.get("G1") is None or devices["G1"].utilisation is None


@pytest.mark.parametrize("text", ["DCGM_FI_DEV_GPU_UTIL{UUID=G1} 5\n", "{}{}\n", "metric_without_value\n",
                                  'DCGM_FI_DEV_GPU_UTIL{UUID="G1"} five\n'])
def test_unparseable_text_fails_the_scrape(text: str) -> None:
    with pytest.raises(ScrapeError):
        device_metrics(DCGM, text)


@given(st.text(max_size=200))
def test_any_text_is_metrics_or_a_scrape_error(text: str) -> None:
    try:
        devices, _ = device_metrics(DCGM, text)
    except ScrapeError:
        return
    for found in devices.values():
        assert found.utilisation is None or 0 <= found.utilisation <= 100
        assert found.power is None or math.isfinite(found.power)


PROCESS_MAPPING = parse_mapping("""
vendor: acme-process
metrics:
  utilisation: {names: [acme_util, acme_process_util]}
  memory_used: {names: [acme_mem, acme_process_mem], scale: 1048576}
labels:
  device: [card]
  pid: [pid]
""", "acme-process.yaml")
PROCESS_TEXT = """\
acme_util{card="c0"} 70
acme_mem{card="c0"} 300
acme_process_util{card="c0",pid="4242"} 50
acme_process_util{card="c0",pid="5151"} 20
acme_process_mem{card="c0",pid="4242"} 100
acme_process_mem{card="c0",pid="5151"} 200
acme_process_util{card="c0",pid="-3"} 99
acme_process_util{card="c0",pid="init"} 99
"""


def test_per_process_figures_stay_apart_from_the_cards_and_are_summed_per_container() -> None:
    found = scrape_metrics(PROCESS_MAPPING, PROCESS_TEXT)
    assert (found.devices["c0"].utilisation, found.devices["c0"].memory_used) == (70.0, 300 * 2**20)
    assert {k: (m.utilisation, m.memory_used) for k, m in found.processes.items()} == {
        ("c0", 4242): (50.0, 100 * 2**20), ("c0", 5151): (20.0, 200 * 2**20)}
    result = ScrapeResult(0.0, True, found.devices, pods=found.pods, processes=found.processes)
    # both processes run in one SharePod's container; an unknown pid is nobody's
    assert result.attribute({4242: ("ml/infer", "app"), 5151: ("ml/infer", "app"), 9: ("ml/x", "y")}) == 2
    share = result.pods[("c0", "ml", "infer", "app")]
    assert (share.utilisation, share.memory_used) == (70.0, 300 * 2**20)


@given(st.text(max_size=12))
def test_any_pid_label_is_a_process_or_the_cards(value: str) -> None:
    if any(c in value for c in '"\\\n'):
        return  # not a label value the text format carries
    text = f'acme_process_util{{card="c0",pid="{value}"}} 5\n'
    found = scrape_metrics(PROCESS_MAPPING, text)
    assert all(0 < pid < 2**31 for _, pid in found.processes)
    assert bool(found.processes) != ("c0" in found.devices)  # one or the other, never both
