from __future__ import annotations

from gpushare_common import events as ev
from gpushare_detector.classify import Rules
from gpushare_detector.pods import PodTracker

from tests.detector import podfactory as pf

NODE = "node-1"


def tracker() -> PodTracker:
    return PodTracker(Rules(), NODE)


def only(events: list[ev.Event]) -> ev.Event:
    assert len(events) == 1, events
    return events[0]


def test_shadow_running_then_terminating_then_cleared() -> None:
    t = tracker()
    view = t.read(pf.shadow("s1", spec=4))
    assert view is not None
    running = only(t.upsert(view, {"main": {"nvidia.com/gpu": ("GPU-a",)}}))
    assert isinstance(running, ev.ShadowEvent)
    assert (running.shadow_pod, running.state, running.devices) == ("ns/s1", "running", ("GPU-a",))
    assert (running.resource, running.share_spec, running.vendor_resource) == ("share-gpu-4", 4, "nvidia.com/gpu")
    terminating = only(t.upsert(t.read(pf.shadow("s1", deleting=True)), None))  # type: ignore[arg-type]
    assert isinstance(terminating, ev.ShadowEvent) and terminating.terminating
    gone = only(t.remove("ns/s1"))
    assert isinstance(gone, ev.ShadowEvent) and gone.state == "cleared"
    assert t.current() == []


def test_shadow_pending_or_without_devices_says_nothing() -> None:
    t = tracker()
    assert t.upsert(t.read(pf.shadow("s", phase="Pending")), {"main": {"nvidia.com/gpu": ("G",)}}) == []  # type: ignore[arg-type]
    assert t.upsert(t.read(pf.shadow("s")), {}) == []  # type: ignore[arg-type]


def test_share_spot_generic_facts() -> None:
    t = tracker()
    share = only(t.upsert(t.read(pf.share("a")),  # type: ignore[arg-type]
                          {"app": {"gpushare/share-gpu-4": ("ns/s1-0",)}}))
    assert isinstance(share, ev.ShareEvent)
    assert (share.share_pod, share.container, share.resource, share.devices) == ("ns/a", "app", "share-gpu-4",
                                                                                 ("ns/s1-0",))
    spot = only(t.upsert(t.read(pf.spot("b")), {"job": {"gpushare/spot-gpu": ("spot-G1",)}}))  # type: ignore[arg-type]
    assert isinstance(spot, ev.SpotEvent) and spot.devices == ("spot-G1",)
    gen = only(t.upsert(t.read(pf.reserved("c", lendable=True)),  # type: ignore[arg-type]
                        {"main": {"nvidia.com/gpu": ("G2", "G3")}, "dind": {}}))
    assert isinstance(gen, ev.GenericEvent) and gen.lendable and gen.devices == ("G2", "G3")
    assert t.reserved_containers() == {"ns/c/main"}
    assert t.owners()["ns/c"].devices == ("G2", "G3")
    assert t.by_class() == {"share": 1, "spot": 1, "reserved": 1}


def test_finished_pod_clears_and_unchanged_pod_is_silent() -> None:
    t = tracker()
    devices = {"main": {"nvidia.com/gpu": ("G",)}}
    first = only(t.upsert(t.read(pf.reserved("r")), devices))  # type: ignore[arg-type]
    assert t.upsert(t.read(pf.reserved("r")), devices) == []  # type: ignore[arg-type]
    done = only(t.upsert(t.read(pf.reserved("r", phase="Succeeded")), None))  # type: ignore[arg-type]
    assert isinstance(done, ev.GenericEvent) and done.state == "cleared" and done.id != first.id


def test_ids_are_deterministic_per_pod_uid() -> None:
    a, b = tracker(), tracker()
    devices = {"main": {"nvidia.com/gpu": ("G",)}}
    e1 = only(a.upsert(a.read(pf.reserved("r")), devices))  # type: ignore[arg-type]
    e2 = only(b.upsert(b.read(pf.reserved("r")), devices))  # type: ignore[arg-type]
    assert e1.id == e2.id
    e3 = only(b.upsert(b.read(pf.reserved("r", uid="other")), devices))  # type: ignore[arg-type]
    assert e3.id != e1.id


def test_replace_all_clears_vanished_and_republishes_nothing_new() -> None:
    t = tracker()
    pods = [pf.reserved("r1"), pf.reserved("r2"), pf.pod("plain")]
    devices = {"ns/r1": {"main": {"nvidia.com/gpu": ("G1",)}}, "ns/r2": {"main": {"nvidia.com/gpu": ("G2",)}}}
    assert len(t.replace_all(pods, devices)) == 2
    assert t.replace_all(pods, devices) == []
    events = t.replace_all(pods[1:], devices)
    gone = only(events)
    assert isinstance(gone, ev.GenericEvent) and gone.pod == "ns/r1" and gone.state == "cleared"
    assert [e.pod for e in t.current()] == ["ns/r2"]  # type: ignore[attr-defined]


def test_malformed_pod_is_counted() -> None:
    t = tracker()
    assert t.read({"metadata": {}}) is None
    assert t.errors["malformed-pod"] == 1
