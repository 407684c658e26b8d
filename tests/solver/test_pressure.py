"""Pressure eviction decisions: table tests and property tests of the parsers."""

from __future__ import annotations

import pytest
from gpushare_common.pods import PodRules, read_pod
from gpushare_solver.pressure import (
    NodeUsage,
    OversoldPod,
    PressureInputError,
    PressurePolicy,
    choose_victims,
    oversold_pod,
)
from hypothesis import given
from hypothesis import strategies as st

GIB = 1 << 30
UNITS = {"vcpu": 1000.0, "vmem": float(GIB)}
POLICY = PressurePolicy(memory_threshold=0.70, cpu_threshold=0.90, cooldown_s=30)


def usage(memory_gib: float = 10, cpu_m: float = 1000) -> NodeUsage:
    return NodeUsage(cpu_used_m=cpu_m, cpu_total_m=8000, memory_used=memory_gib * GIB, memory_total=16 * GIB)


def pod(key: str, priority: int = 0, created: float = 0, vcpu: int = 0, vmem: int = 0) -> OversoldPod:
    return OversoldPod(key=key, priority=priority, created=created, vcpu=vcpu, vmem=vmem)


PODS = [pod("a/old-low", 0, 100, vmem=2), pod("a/new-low", 0, 200, vmem=1),
        pod("a/high", 10, 300, vmem=8), pod("a/cpu-only", 0, 400, vcpu=2)]


@pytest.mark.parametrize("node,last,expected", [
    pytest.param(usage(10), None, [], id="below-threshold"),
    pytest.param(usage(11.5), None, ["a/new-low"], id="newest-lowest-first-one-enough"),
    pytest.param(usage(13), None, ["a/new-low", "a/old-low"], id="until-below"),
    pytest.param(usage(15.5), None, ["a/new-low", "a/old-low", "a/high"], id="then-higher-priority"),
    pytest.param(usage(13), 100.0, [], id="cooldown"),
    pytest.param(usage(13), 50.0, ["a/new-low", "a/old-low"], id="cooldown-over"),
    pytest.param(usage(10, cpu_m=7500), None, ["a/cpu-only"], id="cpu-pressure-evicts-vcpu-pods"),
    pytest.param(usage(30), None, ["a/new-low", "a/old-low", "a/high"], id="not-enough-evicts-all-that-help"),
])
def test_choose_victims(node: NodeUsage, last: float | None, expected: list[str]) -> None:
    assert choose_victims(node, PODS, POLICY, UNITS, last, now=110.0) == expected


def test_usage_from_detector_inputs_and_bad_inputs() -> None:
    inputs = {"node_cpu_used_m": 100.0, "node_cpu_total_m": 2000.0, "node_memory_used": 1.0,
              "node_memory_total": 4.0, "pods": 3.0}
    assert NodeUsage.from_inputs(inputs) == NodeUsage(100.0, 2000.0, 1.0, 4.0)
    with pytest.raises(PressureInputError, match="node_memory_used"):
        NodeUsage.from_inputs({**inputs, "node_memory_used": -1.0})
    with pytest.raises(PressureInputError, match="node_cpu_total_m"):
        NodeUsage.from_inputs({k: v for k, v in inputs.items() if k != "node_cpu_total_m"})


def pod_obj(requests: dict[str, object], priority: object = 5) -> dict[str, object]:
    return {"metadata": {"namespace": "batch", "name": "job-1", "creationTimestamp": "2026-01-02T03:04:05Z"},
            "spec": {"priority": priority, "containers": [{"name": "main", "resources": {"requests": requests}}]}}


def test_oversold_pod_reads_requests() -> None:
    found = oversold_pod(read_pod(pod_obj({"gpushare/vcpu": "2", "gpushare/vmem": "3", "cpu": "1"}), PodRules()))
    assert found is not None
    assert (found.key, found.priority, found.vcpu, found.vmem) == ("batch/job-1", 5, 2, 3)
    assert found.created == 1767323045.0
    assert oversold_pod(read_pod(pod_obj({"cpu": "1"}), PodRules())) is None
    assert oversold_pod(read_pod(pod_obj({"gpushare/vcpu": "0"}), PodRules())) is None
    late = pod_obj({"gpushare/vmem": "1"})
    late["metadata"]["creationTimestamp"] = "not a time"  # type: ignore[index]
    assert oversold_pod(read_pod(late, PodRules())) == OversoldPod("batch/job-1", 5, 0.0, 0, 1)


@given(st.dictionaries(st.sampled_from(["node_cpu_used_m", "node_cpu_total_m", "node_memory_used",
                                         "node_memory_total", "other"]),
                       st.one_of(st.floats(allow_nan=True), st.integers(), st.none(), st.text(max_size=3))))
def test_usage_inputs_never_raise_anything_but_the_typed_error(inputs: dict[str, object]) -> None:
    try:
        NodeUsage.from_inputs(inputs)  # type: ignore[arg-type]
    except PressureInputError:
        pass


@given(st.lists(st.builds(pod, key=st.text(min_size=1, max_size=5), priority=st.integers(-5, 5),
                          created=st.floats(0, 1e9), vcpu=st.integers(0, 4), vmem=st.integers(0, 4)),
                max_size=12, unique_by=lambda p: p.key),
       st.floats(0, 20), st.floats(0, 8000))
def test_victims_always_help_and_respect_order(pods: list[OversoldPod], memory_gib: float, cpu_m: float) -> None:
    node = usage(memory_gib, cpu_m)
    victims = choose_victims(node, pods, POLICY, UNITS, None, now=0.0)
    if not node.over(POLICY):
        assert victims == []
    chosen = [p for p in pods if p.key in victims]
    assert all(p.vcpu or p.vmem for p in chosen)
    ranks = [(p.priority, -p.created, p.key) for p in chosen]
    assert [(p.priority, -p.created, p.key) for p in sorted(chosen, key=lambda p: victims.index(p.key))] \
        == sorted(ranks)
