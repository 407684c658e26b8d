"""Parsers of the node simulator: quantities, pods, workload reports, card IDs;
the scheduler's fit logic; the exporter's text."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from gpushare_sim.fakegpu.cards import (
    CardError,
    FakeCard,
    card_device_id,
    index_of_device_name,
    parse_card_index,
)
from gpushare_sim.fakegpu.exporter import Report, parse_report, render
from gpushare_sim.node.app import node_status
from gpushare_sim.node.devices import ContainerKey, DeviceConflict, DeviceTable
from gpushare_sim.node.model import PodError, parse_pod, parse_quantity
from gpushare_sim.node.settings import NodeSimSettings
from gpushare_sim.node.testing import pod_manifest
from gpushare_sim.scheduler import choose_node, fits
from hypothesis import given
from hypothesis import strategies as st

GPU = "nvidia.com/gpu"


# --- quantities ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [("2", 2), ("500m", Decimal("0.5")), ("1Ki", 1024), ("1Gi", 2**30), ("1e3", 1000),
     ("2k", 2000), (3, 3)],
)  # fmt: skip
def test_quantities(text: Any, value: Any) -> None:
    assert parse_quantity(text) == Decimal(value)


@given(st.one_of(st.text(max_size=12), st.integers(), st.floats(), st.none(), st.booleans()))
def test_quantity_parser_never_raises_anything_but_pod_error(value: Any) -> None:
    try:
        result = parse_quantity(value)
    except PodError as err:
        assert "quantity" in str(err)
    else:
        assert result >= 0


@given(st.integers(min_value=0, max_value=10**12), st.sampled_from(["", "Ki", "Mi", "m", "k"]))
def test_quantity_round_trip(number: int, suffix: str) -> None:
    scale = {"": 1, "Ki": 1024, "Mi": 2**20, "m": Decimal("0.001"), "k": 1000}[suffix]
    assert parse_quantity(f"{number}{suffix}") == number * Decimal(scale)


# --- pods -----------------------------------------------------------------------


def test_pod_parse_sums_requests_over_containers() -> None:
    body = pod_manifest("p", ["sleep", "1"], resources={GPU: "1", "cpu": "500m"},
                        containers=["main", "dind"])  # fmt: skip
    pod = parse_pod(body)
    assert pod.requests() == {GPU: 2, "cpu": Decimal("1.0")}
    assert [c.name for c in pod.containers] == ["main", "dind"]


@pytest.mark.parametrize(
    "body",
    [None, [], {"metadata": {}}, {"metadata": {"name": "x"}, "spec": {"containers": []}},
     {"metadata": {"name": "x"}, "spec": {"containers": [{"image": "a"}]}},
     {"metadata": {"name": "x", "annotations": {"a": 1}}, "spec": {"containers": [{"name": "m"}]}},
     {"metadata": {"name": "x"}, "spec": {"containers": [
         {"name": "m", "resources": {"limits": {GPU: "lots"}}}]}}],
)  # fmt: skip
def test_bad_pods_are_pod_errors(body: Any) -> None:
    with pytest.raises(PodError):
        parse_pod(body)


@given(st.recursive(st.none() | st.text(max_size=5) | st.integers(),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c,
                                                                        max_size=4)))  # fmt: skip
def test_pod_parser_fuzz(body: Any) -> None:
    try:
        parse_pod(body)
    except PodError:
        pass


# --- device table ---------------------------------------------------------------


def test_table_never_gives_a_device_twice() -> None:
    table = DeviceTable()
    table.set_devices(GPU, {"g0": True, "g1": True, "g2": False})
    a, b = ContainerKey("u1", "ns", "a", "main"), ContainerKey("u2", "ns", "b", "main")
    table.record(a, GPU, ["g0"])
    with pytest.raises(DeviceConflict):
        table.record(b, GPU, ["g0"])
    with pytest.raises(DeviceConflict):
        table.record(b, GPU, ["g9"])
    assert table.free(GPU) == ["g1"]
    assert table.allocatable() == {GPU: 2} and table.capacity() == {GPU: 3}
    table.release_pod("u1")
    assert table.free(GPU) == ["g0", "g1"]


# --- cards ----------------------------------------------------------------------


@given(st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?", fullmatch=True),
       st.integers(min_value=0, max_value=10**6))  # fmt: skip
def test_card_ids_round_trip(node: str, index: int) -> None:
    assert parse_card_index(card_device_id(node, index), node) == index
    assert index_of_device_name(f"nvidia{index}") == index


@given(st.text(max_size=20))
def test_card_id_parser_rejects_garbage(value: str) -> None:
    try:
        index = parse_card_index(value, "n1")
    except CardError:
        return
    assert value == card_device_id("n1", index)


# --- exporter -------------------------------------------------------------------


WHERE = ("ns", "pod", "main")


def test_report_parses_and_rejects() -> None:
    good = {"dev": "nvidia1", "util": 50, "mem_mib": 100, "ts": 10.0, "every_ms": 200}
    report = parse_report(json.dumps(good), WHERE)
    assert report is not None and report.card == 1 and report.util == 50
    for bad in ({**good, "util": 101}, {**good, "dev": "sda"}, {**good, "ts": "x"}, [], 5):
        assert parse_report(json.dumps(bad), WHERE) is None
    assert parse_report("{not json", WHERE) is None


@given(st.text(max_size=60))
def test_report_parser_fuzz(text: str) -> None:
    parse_report(text, WHERE)


def test_render_sums_fresh_reports_and_labels_the_owner(tmp_path: Path) -> None:
    cards = [FakeCard(i, f"GPU-n1-{i}", tmp_path / f"nvidia{i}") for i in range(2)]
    reports = [
        Report("ns", "owner", "main", card=0, util=70, mem_mib=1000, ts=100.0, every_ms=200),
        Report("ns", "spot", "main", card=0, util=50, mem_mib=500, ts=100.0, every_ms=200),
        Report("ns", "old", "main", card=1, util=90, mem_mib=1, ts=10.0, every_ms=200),
    ]
    text = render("n1", cards, reports, {"GPU-n1-0": ("ns", "owner", "main")}, 16384, now=101.0)
    lines = {line.split("{")[0] + line.split('gpu="')[1][0]: line.split()[-1]
             for line in text.splitlines() if not line.startswith("#")}  # fmt: skip
    assert lines["DCGM_FI_DEV_GPU_UTIL0"] == "100"
    assert lines["DCGM_FI_DEV_GPU_UTIL1"] == "0"
    assert lines["DCGM_FI_DEV_FB_USED0"] == "1500"
    assert lines["DCGM_FI_DEV_FB_FREE0"] == str(16384 - 1500)
    assert 'pod="owner"' in text and 'UUID="GPU-n1-1"' in text and 'Hostname="n1"' in text


# --- scheduler --------------------------------------------------------------------


def _node(name: str, gpus: int, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "status": {"allocatable": {GPU: str(gpus), "cpu": "4"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip


def test_scheduler_fits_and_spreads() -> None:
    pod = parse_pod(pod_manifest("p", ["x"], resources={GPU: "1"}))
    busy = parse_pod(pod_manifest("b", ["x"], node="n1", resources={GPU: "1"}))
    nodes = [_node("n1", 2), _node("n2", 2)]
    assert choose_node(pod, nodes, [busy]) == "n2"
    assert choose_node(pod, [_node("n1", 1)], [busy]) is None
    unknown = parse_pod(pod_manifest("u", ["x"], resources={"gpushare/share-gpu-4": "1"}))
    assert choose_node(unknown, nodes, []) is None
    body = pod_manifest("s", ["x"], resources={GPU: "1"})
    body["spec"]["nodeSelector"] = {"zone": "b"}
    zoned = [_node("n1", 1, {"zone": "a"}), _node("n2", 1, {"zone": "b"})]
    assert choose_node(parse_pod(body), zoned, []) == "n2"


@given(st.dictionaries(st.sampled_from([GPU, "cpu", "gpushare/vcpu"]),
                       st.integers(min_value=0, max_value=8)),
       st.dictionaries(st.sampled_from([GPU, "cpu", "gpushare/vcpu"]),
                       st.integers(min_value=0, max_value=8)))  # fmt: skip
def test_fits_is_monotone(requests: dict[str, int], free: dict[str, int]) -> None:
    req = {k: Decimal(v) for k, v in requests.items()}
    have = {k: Decimal(v) for k, v in free.items()}
    if fits(req, have):
        assert fits(req, {k: v + 1 for k, v in have.items()})


def test_node_status_reports_vanished_resources_as_zero(tmp_path: Path) -> None:
    table = DeviceTable()
    table.set_devices(GPU, {"g0": True, "g1": False})
    settings = NodeSimSettings(name="n1", sim_dir=tmp_path)
    status = node_status(settings, table, frozenset({"gpushare/spot-gpu"}))
    assert status["capacity"][GPU] == "2" and status["allocatable"][GPU] == "1"
    assert status["capacity"]["gpushare/spot-gpu"] == "0"
    assert status["allocatable"]["cpu"] == "16"
