"""The console's state and views, fed directly (no servers): Kubernetes objects, bucket changes,
stream events in; the fleet, node and eviction views out."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from gpushare_common import dra
from gpushare_common.bus.watch import KeyChange, KeyChanges
from gpushare_common.cardmap import CardFacts
from gpushare_common.events import (
    CardFigures,
    ContainerActivity,
    DeviceHealth,
    EvictionRecord,
    GpuActivity,
    OwnerBackEvent,
    SpareCapacity,
)
from gpushare_common.mapping import RESERVED, SHADOW, DeviceStatus, OwnerEntry
from gpushare_common.pods import PodRules
from gpushare_common.settings import SettingsError
from gpushare_console import views
from gpushare_console.dra import read_claim, read_slice
from gpushare_console.settings import ConsoleSettings
from gpushare_console.state import ClusterState, read_node
from gpushare_console.timeline import Timeline
from gpushare_dra_driver.cards import Card
from gpushare_dra_driver.slices import build_slice
from hypothesis import given
from hypothesis import strategies as st

SETTINGS = ConsoleSettings()
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)


def _node(name: str = "n1", gpus: str = "3", allocatable: str = "2", ready: str = "True") -> dict[str, Any]:
    allocatable_ = {"nvidia.com/gpu": allocatable, "gpushare/vcpu": "4", "gpushare/vmem": "2"}
    return {"metadata": {"name": name}, "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": ready}], "capacity": {"nvidia.com/gpu": gpus},
                       "allocatable": allocatable_}}


def _pod(name: str, node: str = "n1", limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"namespace": "ml", "name": name}, "spec": {"nodeName": node, "containers": [
        {"name": "main", "resources": {"limits": limits or {"nvidia.com/gpu": "1"}}}]}, "status": {"phase": "Running"}}


def _put(key: str, value: Any) -> KeyChange:
    return KeyChange(key, msgspec.json.encode(value))


def _state() -> ClusterState:
    state = ClusterState(PodRules(), keep=10)
    state.nodes_changed("SYNC", None, [_node()])
    state.pods_changed("SYNC", None, [_pod("busy"), _pod("share-1", limits={"gpushare/share-gpu-2": "1"})])
    shadow = OwnerEntry(owner="gpushare-system/s", kind=SHADOW, devices={
        "gpushare-system/s-0": DeviceStatus(id="gpushare-system/s-0", sharing_pod="ml/share-1")})
    state.solver_changed(KeyChanges(True, (
        _put("n1.mapping.ml/busy", OwnerEntry(owner="ml/busy", kind=RESERVED,
                                              devices={"GPU-0": DeviceStatus(id="GPU-0")})),
        _put("n1.mapping.gpushare-system/s", shadow),
        _put("n1.journal.state", CardFacts(inventory={"nvidia.com/gpu": ["GPU-0", "GPU-1"]},
                                           shadow_cards={"gpushare-system/s": ["GPU-1"]})),
    )))
    state.health_changed(KeyChanges(True, (_put("n1.health.spot-gpu", DeviceHealth(
        node="n1", resource="spot-gpu", devices={"spot-GPU-0": "Unhealthy"})),)))
    return state


def test_the_fleet_shows_each_card_and_an_unnamed_card_the_node_cannot_allocate() -> None:
    doc = views.fleet(_state(), SETTINGS)
    (node,) = doc["nodes"]
    assert [(c["card"], c["state"], c["label"]) for c in node["cards"]] == [
        ("GPU-0", "held", "held"), ("GPU-1", "shared", "shared by 1"), ("", "unhealthy", "unhealthy")]
    assert node["ready"] and doc["totals"] == {"held": 1, "shared": 1, "lent": 0, "idle": 0, "unhealthy": 1}
    assert node["spare"] == {"vcpu_devices": 4, "vcpu_millicores": 400, "vmem_devices": 2,
                             "vmem_bytes": 2 * 256 << 20}


def test_the_node_view_names_the_pods_of_each_card_and_the_spare_units_follow_capacity_events() -> None:
    state = _state()
    state.capacity_seen(SpareCapacity(node="n1", resource="vcpu", devices=4, unit=250))
    doc = views.node(state, SETTINGS, "n1")
    assert doc is not None
    shared = doc["cards"][1]
    assert shared["holder_pod"] == {"key": "gpushare-system/s", "known": False}
    assert [p["key"] for p in shared["sharer_pods"]] == ["ml/share-1"]
    assert shared["sharer_pods"][0]["kind"] == "share"
    assert sorted(p["key"] for p in doc["pods"]) == ["ml/busy", "ml/share-1"]
    assert doc["spare"]["vcpu_millicores"] == 1000
    assert views.node(state, SETTINGS, "nowhere") is None


def test_the_node_view_shows_each_pods_gpu_activity_on_its_card() -> None:
    state = _state()
    version = state.changes.version
    rows = (ContainerActivity(pod="ml/busy", container="main", role="owner", cards=("GPU-0",), calls=7,
                              calls_per_s=0.0),
            ContainerActivity(pod="ml/share-1", container="main", role="sharer", cards=("GPU-1",), calls=90,
                              calls_per_s=2.5, shadow="gpushare-system/s", utilisation=40.0),
            ContainerActivity(pod="ml/share-1", container="side", role="sharer", cards=("GPU-1",), calls=10,
                              calls_per_s=0.5),
            ContainerActivity(pod="ml/new", container="main", role="sharer", cards=("GPU-1",)))
    state.activity_seen(GpuActivity(node="n1", containers=rows))
    assert state.changes.version == version + 1
    state.activity_seen(GpuActivity(node="n1", containers=rows))  # the same figures: no new version
    assert state.changes.version == version + 1
    doc = views.node(state, SETTINGS, "n1")
    assert doc is not None
    held, shared = doc["cards"][0], doc["cards"][1]
    assert held["activity"] == {"ml/busy": {"role": "owner", "calls": 7, "calls_per_s": 0.0, "utilisation": None}}
    assert shared["activity"] == {
        "ml/share-1": {"role": "sharer", "calls": 100, "calls_per_s": 3.0, "utilisation": 40.0},
        "ml/new": {"role": "sharer", "calls": None, "calls_per_s": None, "utilisation": None}}


def test_deletes_resets_and_bad_values_change_the_state_as_they_should() -> None:
    state, skipped = _state(), []
    state.on_problem = skipped.append
    before = state.changes.version
    state.solver_changed(KeyChanges(False, (KeyChange("n1.mapping.ml/busy", None),
                                            KeyChange("n1.mapping.ml/bad", b"{not json"),
                                            KeyChange("n1.mapping.=FF=FE", b"{}"),
                                            KeyChange("nodot", b"{}"))))
    assert "ml/busy" not in state.solver["n1"].owners and skipped == ["solver"] * 3
    assert state.changes.version == before + 1
    state.solver_changed(KeyChanges(True, ()))
    assert state.solver["n1"].owners == {} and state.solver["n1"].facts == CardFacts()
    state.pods_changed("DELETED", _pod("busy"), [])
    state.pods_changed("ADDED", {"metadata": {"namespace": "ml"}}, [])
    assert list(state.pods) == ["ml/share-1"] and state.problems["pods"] == 1
    state.pods_changed("DELETED", {"metadata": {"name": "share-1"}}, [])  # no namespace: which pod?
    assert list(state.pods) == ["ml/share-1"] and state.problems["pods"] == 2
    state.pods_changed("DELETED", {**_pod("share-1"), "spec": "junk"}, [])  # its key is all a deletion needs
    assert state.pods == {}
    state.nodes_changed("DELETED", {"metadata": []}, [])
    assert state.problems["nodes"] == 1
    state.nodes_changed("DELETED", _node(), [])
    assert state.nodes == {}


def test_the_timeline_groups_records_by_their_owner_back_and_times_each_hop() -> None:
    timeline = Timeline(keep=10)
    back = OwnerBackEvent(node="n1", pidns=7, pid=70, kernel_ts_ns=1, pod="ml/dev", notice_to_publish_ms=0.8,
                          ts=1000.0)
    timeline.add(back)
    for pod in ("ml/a", "ml/b"):
        timeline.add(EvictionRecord(node="n1", pod=pod, reason="owner-back", owner="ml/dev", trigger_id=back.id,
                                    ts=1000.050, total_ms=40.0, tasks_dead_ms=15.0, released_ms=16.0))
    timeline.add(EvictionRecord(node="n1", pod="ml/c", reason="pressure", ts=2000.0, total_ms=5.0))
    newest, first = timeline.entries()
    assert newest["reason"] == "pressure" and newest["hops"] == []
    assert first["trigger"] == back.id and [e["pod"] for e in first["evictions"]] == ["ml/a", "ml/b"]
    hops = {h["hop"]: h["at_ms"] for h in first["hops"]}
    assert hops == pytest.approx({"notice": 0.0, "published": 0.8, "handled": 10.8, "tasks_dead": 25.8,
                                  "released": 26.8, "evicted": 50.8})


@given(st.integers(min_value=1, max_value=5), st.integers(min_value=0, max_value=20))
def test_the_timeline_keeps_the_newest(keep: int, count: int) -> None:
    timeline = Timeline(keep)
    records = [EvictionRecord(node="n", pod=f"p/{i}", reason="pressure", ts=float(i)) for i in range(count)]
    for record in records:
        timeline.add(record)
    assert list(timeline.records.values()) == records[-keep:] if count else timeline.records == {}


@given(JSON)
def test_any_node_object_reads_or_fails_with_a_value_error(doc: Any) -> None:
    for candidate in (doc, {"metadata": {"name": "n"}, "status": doc}, {"metadata": {"name": "n"}, "spec": doc}):
        try:
            read_node(candidate if isinstance(candidate, dict) else {"metadata": candidate})
        except ValueError:
            pass


def test_a_node_object_reads_its_readiness_and_resources() -> None:
    node = read_node(_node(ready="False"))
    assert not node.ready and node.capacity["nvidia.com/gpu"] == "3"
    with pytest.raises(ValueError, match=r"metadata\.name"):
        read_node({"metadata": {}})


async def test_a_waiter_wakes_at_the_next_version() -> None:
    state = ClusterState(PodRules(), keep=1)
    waiting = asyncio.ensure_future(state.changes.wait(state.changes.version, 5))
    await asyncio.sleep(0)
    state.changes.bump()
    assert await asyncio.wait_for(waiting, 1) == 1
    assert await state.changes.wait(0, 0.01) == 1


@pytest.mark.parametrize("field", ["KEEP", "POLL_S", "HEARTBEAT_S"])
def test_settings_out_of_range_name_the_variable(field: str) -> None:
    with pytest.raises(SettingsError, match=f"GPUSHARE_CONSOLE_{field}"):
        ConsoleSettings(**{field.lower(): 0})


def test_a_nodes_own_watch_resets_that_node_only() -> None:
    """Each node's buckets are followed through its own leaf's domain: a reset of one node's watch
    (its leaf restarted) replaces that node's view and leaves the others' as they were."""
    state = _state()
    other = OwnerEntry(owner="ml/other", kind=SHADOW, devices={})
    state.solver_changed(KeyChanges(False, (_put("n2.mapping.ml/other", other),)), "n2")
    state.health_changed(KeyChanges(False, (_put("n2.health.spot-gpu", DeviceHealth(
        node="n2", resource="spot-gpu", devices={"spot-GPU-n2": "Healthy"})),)), "n2")
    state.solver_changed(KeyChanges(True, ()), "n1")
    state.health_changed(KeyChanges(True, ()), "n1")
    assert state.solver["n1"].owners == {} and state.solver["n1"].spot_health == {}
    assert list(state.solver["n2"].owners) == ["ml/other"] and state.solver["n2"].spot_health
    state.solver_changed(KeyChanges(True, ()), "n3")  # a node seen first by its reset
    assert state.solver["n3"].owners == {} and "ml/other" in state.solver["n2"].owners


# --- DRA nodes: claims, shares, spot mirrors; gpushare's pods and their readiness ----------------

DRA_CARDS = ("GPU-0", "GPU-1", "GPU-2", "GPU-3")


def _slice(lendable: tuple[str, ...], unhealthy: tuple[str, ...] = ()) -> dict[str, Any]:
    """The slice the driver publishes for node d1 (its own builder)."""
    cards = [Card(c, "nvidia.com/gpu", i, c not in unhealthy) for i, c in enumerate(DRA_CARDS)]
    return build_slice("d1", dra.DRIVER, cards, dra.DEFAULT_SHARES, set(lendable), 1)


def _claim(name: str, device: str, pod: str, shares: int = 25, device_class: str = dra.SHARE_CLASS) -> dict[str, Any]:
    """A claim as the scheduler allocates it (one request ``gpu``, reserved for one pod)."""
    result: dict[str, Any] = {"request": "gpu", "driver": dra.DRIVER, "pool": "d1", "device": device}
    if shares:
        result.update(consumedCapacity={dra.SHARES: str(shares)}, shareID=f"share-{name}")
    return {"metadata": {"namespace": "ml", "name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}},
            "status": {"allocation": {"devices": {"results": [result]}},
                       "reservedFor": [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}]}}


SHARES = [_claim("q1-gpu", dra.device_name("GPU-0"), "q1"), _claim("q2-gpu", dra.device_name("GPU-0"), "q2")]
BORROWS = _claim("b-gpu", dra.spot_device_name("GPU-1"), "borrower", shares=0, device_class=dra.SPOT_CLASS)


def _dra_state() -> ClusterState:
    """A DRA node whose solver lends every card (it knows no shares), with two claims of 25 shares on
    GPU-0 (the driver withholds its spot mirror), a spot claim borrowing GPU-1, GPU-3 unhealthy."""
    state = ClusterState(PodRules(), keep=10)
    state.nodes_changed("SYNC", None, [_node("d1", gpus="0", allocatable="0")])
    state.pods_changed("SYNC", None, [_pod(p, node="d1", limits={"cpu": "1"}) for p in ("q1", "q2", "borrower")])
    state.solver_changed(KeyChanges(True, (_put("d1.journal.state", CardFacts(
        inventory={f"{dra.DRIVER}/nvidia.com/gpu": list(DRA_CARDS)})),)))
    state.health_changed(KeyChanges(True, (_put("d1.health.spot-gpu", DeviceHealth(
        node="d1", resource="spot-gpu", devices={f"spot-{c}": "Healthy" for c in DRA_CARDS})),)))
    state.slices_changed("SYNC", None, [_slice(lendable=("GPU-1", "GPU-2"), unhealthy=("GPU-3",))])
    state.claims_changed("SYNC", None, [*SHARES, BORROWS])
    return state


def test_a_dra_cards_claims_share_it_and_its_spot_mirror_is_what_the_slice_offers() -> None:
    state = _dra_state()
    doc = views.node(state, SETTINGS, "d1")
    assert doc is not None
    cards = {c["card"]: c for c in doc["cards"]}
    assert {c: (v["state"], v["spot_health"]) for c, v in cards.items()} == {
        "GPU-0": ("shared", "Unhealthy"), "GPU-1": ("lent", "lent"), "GPU-2": ("idle", "Healthy"),
        "GPU-3": ("unhealthy", "Unhealthy")}
    assert [(c["claim"], c["role"], c["shares"], c["pods"]) for c in cards["GPU-0"]["claims"]] == [
        ("ml/q1-gpu", "share", 25, ["ml/q1"]), ("ml/q2-gpu", "share", 25, ["ml/q2"])]
    assert cards["GPU-0"]["label"] == "shared by 2" and cards["GPU-0"]["dra"]
    assert cards["GPU-1"]["borrower_pod"]["key"] == "ml/borrower"
    assert [(c["claim"], c["role"]) for c in cards["GPU-1"]["claims"]] == [("ml/b-gpu", "spot")]
    assert {p["key"]: p["claims"] for p in doc["pods"]} == {"ml/q1": ["share"], "ml/q2": ["share"],
                                                           "ml/borrower": ["spot"]}
    assert views.fleet(state, SETTINGS)["totals"] == {"held": 0, "shared": 1, "lent": 1, "idle": 1, "unhealthy": 1}


def test_claims_and_slices_come_and_go_and_bad_ones_are_skipped() -> None:
    state, skipped = _dra_state(), []
    state.on_problem = skipped.append
    for claim in SHARES:
        state.claims_changed("DELETED", claim, [])
    cards = {c["card"]: c for c in views.fleet(state, SETTINGS)["nodes"][0]["cards"]}
    assert cards["GPU-0"]["state"] == "idle" and cards["GPU-0"]["claims"] == []
    exclusive = _claim("dev-gpu", dra.device_name("GPU-2"), "dev", shares=100, device_class=dra.EXCLUSIVE_CLASS)
    state.claims_changed("ADDED", exclusive, [])
    cards = {c["card"]: c for c in views.fleet(state, SETTINGS)["nodes"][0]["cards"]}
    assert (cards["GPU-2"]["state"], cards["GPU-2"]["holder"]) == ("held", "ml/dev")
    bad = _claim("bad", "gpu-0", "x")
    bad["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = {dra.SHARES: "lots"}
    state.claims_changed("ADDED", bad, [])
    worse = {"metadata": {"namespace": "ml", "name": "worse"}, "status": {"reservedFor": "x"}}
    state.claims_changed("ADDED", worse, [])
    state.slices_changed("MODIFIED", {"metadata": {"name": "s"}, "spec": {"devices": []}}, [])
    assert skipped == ["claims", "claims", "slices"] and not {"ml/bad", "ml/worse"} & set(state.claims)
    state.slices_changed("DELETED", _slice(lendable=()), [])
    cards = {c["card"]: c for c in views.fleet(state, SETTINGS)["nodes"][0]["cards"]}
    assert not any(c["dra"] for c in cards.values()) and cards["GPU-0"]["spot_health"] == "Healthy"


def test_a_slice_of_another_driver_names_no_card() -> None:
    other = {"metadata": {"name": "n-other"}, "spec": {"driver": "gpu.example.com", "nodeName": "d1", "devices": [
        {"name": "gpu-0", "attributes": {"kind": {"string": "card"}, "uuid": {"string": "GPU-0"}}}]}}
    assert read_slice(other).devices == {}
    assert read_claim(_claim("q", "gpu-0", "p")).devices[0].shares == 25


@given(JSON)
def test_any_claim_or_slice_object_reads_or_fails_with_a_value_error(doc: Any) -> None:
    for read in (read_claim, read_slice):
        for candidate in (doc, {"metadata": {"name": "c", "namespace": "ml"}, "status": doc},
                          {"metadata": {"name": "s"}, "spec": doc}):
            try:
                read(candidate)
            except ValueError:
                pass


def _service(name: str, service: str, ready: str, namespace: str = "gpushare-system") -> dict[str, Any]:
    doc = _pod(name, limits={"cpu": "1"})
    doc["metadata"].update(namespace=namespace, labels={"app.kubernetes.io/part-of": "gpushare",
                                                         "app.kubernetes.io/name": service})
    doc["status"]["conditions"] = [{"type": "Ready", "status": ready}]
    return doc


def test_the_fleet_shows_gpushares_pods_on_each_node_with_their_readiness() -> None:
    state = _state()
    state.pods_changed("ADDED", _service("gpushare-detector-a1", "gpushare-detector", "True"), [])
    state.pods_changed("ADDED", _service("gpushare-solver-b2", "gpushare-solver", "False"), [])
    state.pods_changed("ADDED", _service("lookalike", "gpushare-solver", "True", namespace="ml"), [])
    (node,) = views.fleet(state, SETTINGS)["nodes"]
    assert [(s["name"], s["pod"], s["ready"]) for s in node["services"]] == [
        ("detector", "gpushare-system/gpushare-detector-a1", True),
        ("solver", "gpushare-system/gpushare-solver-b2", False)]
    state.pods_changed("DELETED", _service("gpushare-solver-b2", "gpushare-solver", "False"), [])
    assert [s["name"] for s in views.fleet(state, SETTINGS)["nodes"][0]["services"]] == ["detector"]
    state.pods_changed("SYNC", None, [])
    assert views.fleet(state, SETTINGS)["nodes"][0]["services"] == [] and state.services == {}


def test_a_card_the_solver_knows_dra_shares_use_is_shared_before_its_claims_are_seen() -> None:
    state = ClusterState(PodRules(), keep=10)
    state.solver_changed(KeyChanges(True, (_put("d1.journal.state", CardFacts(
        inventory={f"{dra.DRIVER}/nvidia.com/gpu": ["GPU-0", "GPU-1"]},
        dra_shared={f"{dra.DRIVER}/nvidia.com/gpu": ["GPU-0"]})),)))
    cards = {c["card"]: c for c in views.fleet(state, SETTINGS)["nodes"][0]["cards"]}
    assert (cards["GPU-0"]["state"], cards["GPU-0"]["label"]) == ("shared", "shared (DRA)")
    assert cards["GPU-1"]["state"] == "idle"



def test_each_cards_utilisation_is_the_detectors_last_scrape_while_it_is_fresh() -> None:
    state = _state()
    before = state.changes.version
    figures = {"GPU-0": CardFigures(utilisation=37.4, memory_used=2 << 30, memory_total=16 << 30),
               "GPU-1": CardFigures()}
    activity = GpuActivity(node="n1", cards=figures)
    state.activity_seen(activity)
    cards = {c["card"]: c for c in views.fleet(state, SETTINGS)["nodes"][0]["cards"]}
    assert cards["GPU-0"]["usage"] == {"utilisation": 37.4, "memory_used": 2 << 30, "memory_total": 16 << 30}
    assert cards["GPU-1"]["usage"] == {"utilisation": None, "memory_used": None, "memory_total": None}
    assert cards[""]["usage"] is None and state.changes.version == before + 1
    state.activity_seen(msgspec.structs.replace(activity, id="again"))  # the same figures: the page is not told
    assert state.changes.version == before + 1
    doc = views.node(state, SETTINGS, "n1")
    assert doc is not None and doc["cards"][0]["usage"]["utilisation"] == 37.4
    state.activity_seen(msgspec.structs.replace(activity, ts=activity.ts - views.FIGURES_MAX_AGE_S - 1))
    assert all(c["usage"] is None for c in views.fleet(state, SETTINGS)["nodes"][0]["cards"])
