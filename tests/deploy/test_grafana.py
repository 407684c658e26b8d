"""The Grafana dashboard (k8s/grafana) asks only for metrics the services really export.

The exported names are read from the services' own registries: each service's metrics class
is instantiated (with its collectors: the solver's card ledger, the kmod-bridge's GPU calls,
the detector's exporter numbers, the bus's counters) and its exposition is parsed for the
sample names each family produces (a counter is named with its ``_total``; a histogram ``x``
gives ``x_bucket``, ``x_count``, ``x_sum``). Every PromQL query of the dashboard is reduced to the metric names it
selects; each must be one of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpushare_common.bus.connection import BusMetrics
from gpushare_console.metrics import ConsoleMetrics
from gpushare_detector.metrics import DetectorMetrics
from gpushare_kmod_bridge.metrics import BridgeMetrics, CallCount
from gpushare_solver.metrics import SolverMetrics
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "k8s" / "grafana" / "gpushare-dashboard.json"
# the text format's TYPE line names a counter with its _total; a histogram's samples add these
SUFFIXES = {"histogram": ("_bucket", "_count", "_sum"), "summary": ("", "_count", "_sum")}
# PromQL words that are not metric names (functions are recognised by the "(" after them)
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or",
            "unless", "inf", "nan"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def exported() -> set[str]:
    """Every sample name the services' registries expose."""
    registry = CollectorRegistry()
    SolverMetrics(registry)
    bridge = BridgeMetrics(registry)
    bridge.follow_gpu_calls(lambda: [CallCount("ns/pod", "main", 3)])
    DetectorMetrics(registry).follow_gpus(lambda: None)
    ConsoleMetrics(registry)
    BusMetrics(registry)
    names: set[str] = set()
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names.update(name + suffix for suffix in SUFFIXES.get(kind, ("",)))
    return names


def metric_names(query: str) -> set[str]:
    """The metric names a PromQL query selects (strings, label matchers, ranges, groupings and
    function names taken out; Grafana's ``$variables`` are not names)."""
    text = _STRING.sub(" ", query)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)
    found = set()
    for match in _NAME.finditer(text):
        rest = text[match.end():].lstrip()
        if rest.startswith("(") or match.group().lower() in KEYWORDS:
            continue
        if match.start() > 0 and (text[match.start() - 1].isdigit() or text[match.start() - 1] == "."):
            continue  # the exponent or unit of a number (1e3, 0.99)
        found.add(match.group())
    return found


def _panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in doc.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def queries(doc: dict[str, Any]) -> list[str]:
    found = [t["expr"] for p in _panels(doc) for t in p.get("targets", []) if t.get("expr")]
    for variable in doc.get("templating", {}).get("list", []):
        query = variable.get("query")
        text = query.get("query") if isinstance(query, dict) else query
        if variable.get("type") == "query" and text:
            found.append(re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", text))
    return found


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def test_every_query_names_only_metrics_the_services_export(dashboard: dict[str, Any]) -> None:
    names = exported()
    found = queries(dashboard)
    assert len(found) >= 10
    for query in found:
        selected = metric_names(query)
        assert selected, f"no metric found in {query!r}"
        unknown = sorted(selected - names)
        assert not unknown, f"{query!r} names {unknown}, which no service exports"


def test_the_dashboard_covers_the_sharing_map_activity_and_evictions(dashboard: dict[str, Any]) -> None:
    used = {name for query in queries(dashboard) for name in metric_names(query)}
    for wanted in ("gpushare_card_users", "gpushare_card_lent_seconds_total", "gpushare_card_idle_seconds_total",
                   "gpushare_kmod_gpu_calls_total", "gpushare_pod_gpu_utilisation_percent",
                   "gpushare_solver_evictions_total", "gpushare_solver_owner_back_seconds_bucket"):
        assert wanted in used


def test_panels_are_laid_out_and_use_the_datasource_variable(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] and dashboard["schemaVersion"] >= 36
    assert "datasource" in {v["name"] for v in dashboard["templating"]["list"]}
    ids = [p["id"] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in _panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"


def test_the_checker_catches_a_metric_no_service_exports() -> None:
    names = exported()
    assert metric_names('sum by (pod) (rate(gpushare_kmod_gpu_calls_total{pod=~"a.*"}[5m]))') \
        == {"gpushare_kmod_gpu_calls_total"}
    assert metric_names("histogram_quantile(0.99, sum by (le) (rate(gpushare_nope_bucket[1m])))") \
        == {"gpushare_nope_bucket"}
    assert "gpushare_nope_bucket" not in names and "gpushare_card_users" in names
    assert "gpushare_solver_evictions" not in names  # a counter is exposed with _total only


@given(st.sampled_from(sorted(exported())), st.sampled_from(["rate", "increase", "max_over_time"]),
       st.sampled_from(["", '{node=~"$node"}', '{pod="a/b",card!=""}']), st.sampled_from(["5m", "$__rate_interval"]))
def test_a_selector_in_any_wrapping_yields_its_name(name: str, fn: str, matcher: str, window: str) -> None:
    query = f"sum by (card, pod) ({fn}({name}{matcher}[{window}])) / 1e3"
    assert metric_names(query) == {name}
