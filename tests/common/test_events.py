"""Typed events, subjects and settings."""

from __future__ import annotations

import json
from typing import Literal

import msgspec
import pytest
from gpushare_common import events, subjects
from gpushare_common.settings import NatsSettings, SettingsError, load
from hypothesis import given
from hypothesis import strategies as st


def sample_events() -> list[events.Event]:
    return [
        events.ShadowEvent(node="n1", shadow_pod="gs/s1", state="running", devices=("GPU-0",)),
        events.ShareEvent(node="n1", share_pod="ml/p", container="c", resource="share-gpu-4",
                          state="using", devices=("gs/s1-0",)),
        events.ReservedEvent(node="n1", pod="dev/m", container="main",
                             vendor_resource="nvidia.com/gpu", state="using", lendable=True),
        events.SpotEvent(node="n1", pod="b/x", container="c", state="using", devices=("spot-GPU-0",)),
        events.CardInventory(node="n1", vendor_resource="nvidia.com/gpu", devices=("GPU-0", "GPU-1")),
        events.LowPowerEvent(node="n1", owner="dev/m", using=False),
        events.OwnerBackEvent(node="n1", pidns=4026531836, pid=12, kernel_ts_ns=5),
        events.DeviceHealth(node="n1", resource="spot-gpu", devices={"spot-GPU-0": "Healthy"}),
        events.HealthApplied(node="n1", resource="spot-gpu", devices={"spot-GPU-0": "Unhealthy"}, request_id="r1"),
        events.SpareCapacity(node="n1", resource="vcpu", devices=7, unit=100),
        events.KmodCommand(node="n1", op="detect", pidns=(1, 2)),
        events.KmodCommand(node="n1", op="add", pods=("ml/p/c",), placements=(
            events.Placement(container="ml/p/c", role="sharer", cards=("GPU-0",), shadow="gs/s1"),)),
        events.KmodReply(node="n1", op="stats", status=0,
                         stats=(events.NamespaceStats(pidns=1, hits=3, container="c", role="sharer"),),
                         processes=(events.ProcessOwner(pid=4242, pidns=1, pod="ml/p", container="c"),)),
        events.EvictionRecord(node="n1", pod="b/x", reason="owner-back"),
        events.GpuActivity(node="n1", containers=(
            events.ContainerActivity(pod="ml/p", container="c", role="sharer", cards=("GPU-0",), calls=7,
                                     calls_per_s=1.5),)),
    ]


@pytest.mark.parametrize("event", sample_events(), ids=lambda e: events.event_tag(e))
def test_round_trip(event: events.Event) -> None:
    assert events.decode(events.encode(event)) == event


def test_every_type_is_covered() -> None:
    assert {type(e) for e in sample_events()} == set(events.EVENT_TYPES)


def test_older_reader_accepts_newer_message_with_extra_field() -> None:
    doc = json.loads(events.encode(events.LowPowerEvent(node="n1", owner="dev/m", using=True)))
    doc["field_from_the_future"] = {"nested": [1, 2]}
    decoded = events.decode(json.dumps(doc).encode())
    assert isinstance(decoded, events.LowPowerEvent) and decoded.using


def test_a_renamed_event_keeps_its_wire_tag_and_subject() -> None:
    """ReservedEvent was GenericEvent: what an older detector wrote decodes, and what a newer one
    writes carries the old tag and subject, so an older solver reads it too."""
    old = (b'{"type":"generic","node":"n1","id":"x","ts":1.0,"pod":"dev/m","container":"main",'
           b'"vendor_resource":"nvidia.com/gpu","state":"using","devices":["GPU-0"],"lendable":true}')
    decoded = events.decode(old)
    assert isinstance(decoded, events.ReservedEvent) and decoded.devices == ("GPU-0",) and decoded.lendable
    assert json.loads(events.encode(decoded))["type"] == "generic"
    assert subjects.Subjects("gpushare.v1").event("n1", "generic") == "gpushare.v1.n1.event.generic"


def test_newer_reader_fills_defaults_for_older_message() -> None:
    old = b'{"type":"ownerback","node":"n1","id":"x","ts":1.0,"pidns":5,"pid":1,"kernel_ts_ns":2}'
    decoded = events.decode(old)
    assert isinstance(decoded, events.OwnerBackEvent) and decoded.resolved is False


def test_a_new_literal_value_is_refused_by_an_older_reader() -> None:
    """Why the solver treats an unanswered ``hold`` as no hold (see the module's evolution rules)."""

    class OldKmodCommand(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="kmod_cmd"):
        node: str
        op: Literal["add", "delete", "detect", "undetect", "release", "stats", "config"]

    hold = events.encode(events.KmodCommand(node="n1", op="hold", pidns=(5,)))
    assert isinstance(events.decode(hold), events.KmodCommand)
    with pytest.raises(msgspec.ValidationError, match="Invalid enum value 'hold'"):
        msgspec.json.decode(hold, type=OldKmodCommand)


@pytest.mark.parametrize("payload", [b"", b"{", b"[]", b'{"type":"nope","node":"n"}',
                                     b'{"type":"shadow"}', b'{"type":"spot","node":1}'])
def test_bad_payloads_are_typed_errors(payload: bytes) -> None:
    with pytest.raises(events.EventDecodeError):
        events.decode(payload)


@given(st.binary(max_size=300))
def test_decode_never_raises_anything_else(payload: bytes) -> None:
    try:
        events.decode(payload)
    except events.EventDecodeError:
        pass


def test_events_are_frozen() -> None:
    event = sample_events()[0]
    with pytest.raises(AttributeError):
        event.node = "other"  # type: ignore[misc]


def test_subjects_build_and_parse() -> None:
    s = subjects.Subjects()
    assert s.event("gpu-1.example.com", "ownerback") == "gpushare.v1.gpu-1_example_com.event.ownerback"
    assert s.parse(s.event("gpu-1.example.com", "spot")) == subjects.SubjectInfo(
        "gpu-1.example.com", "event", "spot")
    assert s.health("n1", "gpushare/spot-gpu") == "gpushare.v1.n1.health.spot-gpu"
    assert s.parse(s.kmod_cmd("n1", "release")) == subjects.SubjectInfo("n1", "kmod", "solver")
    assert s.parse(s.kmod_cmd("n1", "add")) == subjects.SubjectInfo("n1", "kmod", "detector")
    assert s.parse(s.eviction("n1")) == subjects.SubjectInfo("n1", "eviction", "")
    assert s.parse(s.capacity("n1", "vmem")).name == "vmem"
    assert s.parse(s.fence("n1", "gpushare/spot-gpu")) == subjects.SubjectInfo("n1", "fence", "spot-gpu")
    assert s.node_fences("n1").endswith(".n1.fence.*")


def test_the_subjects_of_many_nodes_and_of_nats_itself() -> None:
    s = subjects.Subjects("t.v1")
    assert s.node_all("n.1") == "t.v1.n_1.>" and s.node_channel("n.1", "capacity.*") == "t.v1.n_1.capacity.*"
    assert (s.every_node_eviction(), s.every_node_event("ownerback")) == ("t.v1.*.eviction", "t.v1.*.event.ownerback")
    assert s.rebase("t.v1.n1.event.spot", subjects.Subjects("sandbox")) == "sandbox.n1.event.spot"
    with pytest.raises(subjects.SubjectError):
        s.rebase("other.n1.event.spot", subjects.DEFAULT)
    with pytest.raises(subjects.SubjectError):
        s.every_node_event("bogus")
    assert subjects.inbox("solver", "n.1") == "_INBOX.solver.n_1" and subjects.inbox("observer") == "_INBOX.observer"
    key = subjects.kv_key("gpushare-kmod", "n1.watch.4")
    assert key == "$KV.gpushare-kmod.n1.watch.4" and subjects.kv_key_of("gpushare-kmod", key) == "n1.watch.4"
    assert subjects.js_direct_get(subjects.kv_stream("b"), subjects.below(subjects.kv_key("b", "n1"))) == \
        "$JS.API.DIRECT.GET.KV_b.$KV.b.n1.>"
    assert subjects.js_consumer_create("S") == "$JS.API.CONSUMER.CREATE.S"
    assert subjects.js_consumer_create("S", "d", "t.v1.n1.event.*") == "$JS.API.CONSUMER.CREATE.S.d.t.v1.n1.event.*"
    assert (subjects.js_consumer_next("S", "d"), subjects.js_acks("S", "d")) == (
        "$JS.API.CONSUMER.MSG.NEXT.S.d", "$JS.ACK.S.d.>")


@pytest.mark.parametrize("bad", ["gpushare.v2.n1.event.spot", "gpushare.v1.n1.event.bogus",
                                 "gpushare.v1.n1", "gpushare.v1.n1.kmod.x", "gpushare.v1..event.spot"])
def test_bad_subjects(bad: str) -> None:
    with pytest.raises(subjects.SubjectError):
        subjects.DEFAULT.parse(bad)


@given(st.text(max_size=60))
def test_subject_parse_only_raises_subject_error(text: str) -> None:
    try:
        subjects.DEFAULT.parse(text)
    except subjects.SubjectError:
        pass


def test_node_names_with_underscore_are_refused() -> None:
    with pytest.raises(subjects.SubjectError, match="without '_'"):
        subjects.node_token("bad_node")


def test_settings_from_environment() -> None:
    s = load(NatsSettings, "X_", {"X_URL": "nats://h:1", "X_STREAM_REPLICAS": "3", "X_UNKNOWN": "1"})
    assert (s.url, s.stream_replicas) == ("nats://h:1", 3)
    with pytest.raises(SettingsError, match="X_STREAM_REPLICAS='three': expected a number"):
        load(NatsSettings, "X_", {"X_STREAM_REPLICAS": "three"})
