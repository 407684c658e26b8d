from __future__ import annotations

from typing import Any

from gpushare_common import dra
from gpushare_common import events as ev
from gpushare_common.pods import Pod as PodView
from gpushare_common.pods import PodRules
from gpushare_detector.pods import PodTracker

from tests.detector import podfactory as pf

NODE = "node-1"


def tracker() -> PodTracker:
    return PodTracker(PodRules(), NODE)


def see(t: PodTracker, pod: dict[str, Any]) -> PodView:
    view = t.read(pod)
    assert view is not None
    return view


def only(events: list[ev.Event]) -> ev.Event:
    assert len(events) == 1, events
    return events[0]


SHADOW_S1 = f"{pf.SYSTEM}/s1"


def test_shadow_running_then_terminating_then_cleared() -> None:
    t = tracker()
    running = only(t.upsert(see(t, pf.shadow("s1", spec=4)), {"main": {"nvidia.com/gpu": ("GPU-a",)}}))
    assert isinstance(running, ev.ShadowEvent)
    assert (running.shadow_pod, running.state, running.devices) == (SHADOW_S1, "running", ("GPU-a",))
    assert (running.resource, running.share_spec) == ("share-gpu-4", 4)
    assert running.vendor_resource == "nvidia.com/gpu"
    terminating = only(t.upsert(see(t, pf.shadow("s1", deleting=True)), None))
    assert isinstance(terminating, ev.ShadowEvent) and terminating.terminating
    gone = only(t.remove(SHADOW_S1))
    assert isinstance(gone, ev.ShadowEvent) and gone.state == "cleared"
    assert t.current() == []


def test_shadow_pending_or_without_devices_says_nothing() -> None:
    t = tracker()
    assert t.upsert(see(t, pf.shadow("s", phase="Pending")), {"main": {"nvidia.com/gpu": ("G",)}}) == []
    assert t.upsert(see(t, pf.shadow("s")), {}) == []


def test_share_spot_generic_facts() -> None:
    t = tracker()
    share = only(t.upsert(see(t, pf.share("a")),
                          {"app": {"gpushare/share-gpu-4": ("ns/s1-0",)}}))
    assert isinstance(share, ev.ShareEvent)
    assert (share.share_pod, share.container, share.resource, share.devices) == ("ns/a", "app", "share-gpu-4",
                                                                                 ("ns/s1-0",))
    spot = only(t.upsert(see(t, pf.spot("b")), {"job": {"gpushare/spot-gpu": ("spot-G1",)}}))
    assert isinstance(spot, ev.SpotEvent) and spot.devices == ("spot-G1",)
    gen = only(t.upsert(see(t, pf.reserved("c", lendable=True)),
                        {"main": {"nvidia.com/gpu": ("G2", "G3")}, "dind": {}}))
    assert isinstance(gen, ev.ReservedEvent) and gen.lendable and gen.devices == ("G2", "G3")
    assert [(k, p.role) for k, p in sorted(t.placements().items())] == \
        [("ns/a/app", "sharer"), ("ns/b/job", "borrower"), ("ns/c/main", "owner")]
    assert t.owners()["ns/c"].devices == ("G2", "G3")
    assert t.by_class() == {"share": 1, "spot": 1, "reserved": 1}


def test_every_container_placed_on_a_card_has_its_role_cards_and_shadowpod() -> None:
    """From pod-resources' answers only: the ShadowPod's card reaches its SharePods through the
    virtual device ids, the borrower's through its spot device, a DRA share claim's through its
    CDI device."""
    t = tracker()
    t.upsert(see(t, pf.shadow("s1")), {"main": {"nvidia.com/gpu": ("GPU-a",)}})
    t.upsert(see(t, pf.share("a")), {"app": {"gpushare/share-gpu-4": (f"{SHADOW_S1}-0", f"{SHADOW_S1}-1")}})
    t.upsert(see(t, pf.spot("b")), {"job": {"gpushare/spot-gpu": ("spot-GPU-b",)}})
    t.upsert(see(t, pf.reserved("c", lendable=True)), {"main": {"nvidia.com/gpu": ("GPU-b",)}, "dind": {}})
    claim = dra.cdi_device("share", "0a1b-2c3d", "GPU-c").qualified
    t.upsert(see(t, pf.pod("d", requests={"app": {}})), {"app": {dra.CDI_KIND: (claim, "not-a-cdi-name")}})
    t.upsert(see(t, pf.pod("e", requests={"app": {}}, phase="Succeeded")), {"app": {dra.CDI_KIND: (claim,)}})
    assert t.placements() == {
        "ns/a/app": ev.Placement(container="ns/a/app", role="sharer", cards=("GPU-a",), shadow=SHADOW_S1),
        "ns/b/job": ev.Placement(container="ns/b/job", role="borrower", cards=("GPU-b",)),
        "ns/c/main": ev.Placement(container="ns/c/main", role="owner", cards=("GPU-b",)),
        "ns/d/app": ev.Placement(container="ns/d/app", role="sharer", cards=("GPU-c",)),
    }


def test_finished_pod_clears_and_unchanged_pod_is_silent() -> None:
    t = tracker()
    devices = {"main": {"nvidia.com/gpu": ("G",)}}
    first = only(t.upsert(see(t, pf.reserved("r")), devices))
    assert t.upsert(see(t, pf.reserved("r")), devices) == []
    done = only(t.upsert(see(t, pf.reserved("r", phase="Succeeded")), None))
    assert isinstance(done, ev.ReservedEvent) and done.state == "cleared" and done.id != first.id


def test_ids_are_deterministic_per_pod_uid() -> None:
    a, b = tracker(), tracker()
    devices = {"main": {"nvidia.com/gpu": ("G",)}}
    e1 = only(a.upsert(see(a, pf.reserved("r")), devices))
    e2 = only(b.upsert(see(b, pf.reserved("r")), devices))
    assert e1.id == e2.id
    e3 = only(b.upsert(see(b, pf.reserved("r", uid="other")), devices))
    assert e3.id != e1.id


def test_replace_all_clears_vanished_and_republishes_nothing_new() -> None:
    t = tracker()
    pods = [pf.reserved("r1"), pf.reserved("r2"), pf.pod("plain")]
    devices = {"ns/r1": {"main": {"nvidia.com/gpu": ("G1",)}}, "ns/r2": {"main": {"nvidia.com/gpu": ("G2",)}}}
    assert len(t.replace_all(pods, devices)) == 2
    assert t.replace_all(pods, devices) == []
    events = t.replace_all(pods[1:], devices)
    gone = only(events)
    assert isinstance(gone, ev.ReservedEvent) and gone.pod == "ns/r1" and gone.state == "cleared"
    assert [e.pod for e in t.current()] == ["ns/r2"]  # type: ignore[attr-defined]


def test_malformed_pod_is_counted() -> None:
    t = tracker()
    assert t.read({"metadata": {}}) is None
    assert t.errors["malformed-pod"] == 1
