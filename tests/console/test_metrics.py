"""The sharing map and per-pod GPU activity as metrics, from each service's metrics class: the
solver's card ledger, the kmod-bridge's GPU calls, the detector's exporter numbers per pod."""

from __future__ import annotations

from typing import Any

from gpushare_common.cardmap import CardUse
from gpushare_detector.gpumetrics import scrape_metrics
from gpushare_detector.metrics import DetectorMetrics
from gpushare_detector.scraper import ScrapeResult
from gpushare_detector.vendors import BUILTIN_DIR, load_mappings
from gpushare_kmod_bridge.metrics import BridgeMetrics, CallCount
from gpushare_solver.metrics import SolverMetrics
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry


def samples(registry: CollectorRegistry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for family in registry.collect() for s in family.samples
            if s.name == name}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_solver_exports_who_uses_each_card_and_how_long_cards_were_lent_or_idle() -> None:
    registry, clock = CollectorRegistry(), Clock()
    metrics = SolverMetrics(registry)
    metrics.cards.clock = clock
    metrics.cards.update([CardUse(card="G0", state="idle")])
    clock.now += 10
    metrics.cards.update([CardUse(card="G0", state="lent", holder="ml/dev", borrower="ml/spot"),
                          CardUse(card="G1", state="shared", holder="s/a", sharers=("ml/x", "ml/y"))])
    clock.now += 4
    users = samples(registry, "gpushare_card_users")
    assert set(users) == {(("card", c), ("kind", k), ("pod", p)) for c, p, k in [
        ("G0", "ml/dev", "owner"), ("G0", "ml/spot", "borrower"), ("G1", "s/a", "owner"),
        ("G1", "ml/x", "sharer"), ("G1", "ml/y", "sharer")]}
    assert samples(registry, "gpushare_card_idle_seconds_total") == {(("card", "G0"),): 10.0}
    assert samples(registry, "gpushare_card_lent_seconds_total") == {(("card", "G0"),): 4.0}
    assert samples(registry, "gpushare_card_state")[(("card", "G1"), ("state", "shared"))] == 1


@given(st.lists(st.tuples(st.sampled_from(["lent", "idle", "held"]), st.floats(0, 100)), max_size=12))
def test_lent_and_idle_seconds_add_up_to_the_time_in_each_state(steps: list[tuple[str, float]]) -> None:
    registry, clock = CollectorRegistry(), Clock()
    metrics = SolverMetrics(registry)
    metrics.cards.clock = clock
    expected = {"lent": 0.0, "idle": 0.0, "held": 0.0}
    for state, seconds in steps:
        metrics.cards.update([CardUse(card="G0", state=state)])  # type: ignore[arg-type]
        clock.now += seconds
        expected[state] += seconds
    for state in ("lent", "idle"):
        found = samples(registry, f"gpushare_card_{state}_seconds_total").get((("card", "G0"),), 0.0)
        assert abs(found - expected[state]) < 1e-6


def test_an_owner_back_is_timed_per_hop() -> None:
    registry = CollectorRegistry()
    SolverMetrics(registry).owner_back_done(10.0, 10.02, 10.021, 10.1)
    counts = samples(registry, "gpushare_solver_owner_back_seconds_count")
    assert counts == {(("hop", "tasks_dead"),): 1, (("hop", "released"),): 1, (("hop", "evicted"),): 1}
    sums = samples(registry, "gpushare_solver_owner_back_seconds_sum")
    assert abs(sums[(("hop", "evicted"),)] - 0.1) < 1e-9


def test_the_bridge_exports_the_gpu_calls_per_container_with_its_role_card_and_shadowpod() -> None:
    registry = CollectorRegistry()
    calls = [CallCount("ml/dev", "main", 5, "owner", "G0"), CallCount("ml/dev", "main", 2, "owner", "G0"),
             CallCount("ml/dev", "dind", 1), CallCount("ml/infer", "app", 4, "sharer", "G1", "gpushare-system/s1"),
             CallCount("", "", 9)]
    BridgeMetrics(registry).follow_gpu_calls(lambda: calls)

    def labels(pod: str, container: str, role: str = "", card: str = "", shadow: str = "") -> tuple[Any, ...]:
        return tuple(sorted({"pod": pod, "container": container, "role": role, "card": card,
                             "shadow": shadow}.items()))  # fmt: skip

    assert samples(registry, "gpushare_kmod_gpu_calls_total") == {
        labels("ml/dev", "dind"): 1, labels("ml/dev", "main", "owner", "G0"): 7,
        labels("ml/infer", "app", "sharer", "G1", "gpushare-system/s1"): 4}


DCGM_TEXT = """\
DCGM_FI_DEV_GPU_UTIL{UUID="G0",gpu="0",pod="infer-1",namespace="ml",container="main"} 40
DCGM_FI_DEV_GPU_UTIL{UUID="G0",gpu="0",pod="infer-2",namespace="ml",container="main"} 40
DCGM_FI_DEV_FB_USED{UUID="G0",gpu="0",pod="infer-1",namespace="ml",container="main"} 100
DCGM_FI_DEV_GPU_UTIL{UUID="G1",gpu="1",pod="",namespace="",container=""} 0
"""


def test_the_detector_exports_what_the_exporter_says_per_card_and_per_pod() -> None:
    devices, pods, problems, _ = scrape_metrics(load_mappings(BUILTIN_DIR)["nvidia-dcgm"], DCGM_TEXT)
    registry = CollectorRegistry()
    result: list[Any] = [ScrapeResult(0.0, True, devices, pods=pods)]
    DetectorMetrics(registry).follow_gpus(lambda: result[0])
    assert samples(registry, "gpushare_gpu_utilisation_percent") == {(("card", "G0"),): 40, (("card", "G1"),): 0}
    assert samples(registry, "gpushare_pod_gpu_utilisation_percent") == {
        (("card", "G0"), ("container", "main"), ("pod", "ml/infer-1")): 40,
        (("card", "G0"), ("container", "main"), ("pod", "ml/infer-2")): 40}
    assert samples(registry, "gpushare_pod_gpu_memory_used_bytes") == {
        (("card", "G0"), ("container", "main"), ("pod", "ml/infer-1")): 100 * 1048576}
    assert not problems
    result[0] = None  # a failed or old scrape: nothing is exported, never a 0
    assert samples(registry, "gpushare_gpu_utilisation_percent") == {}
