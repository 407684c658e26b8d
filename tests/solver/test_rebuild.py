"""Rebuilding an empty MappingCache from the node's pods: the function directly (table and property
tests), then the solver starting on an empty bucket against the API emulator and nats-server."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from gpushare_common.adapters.kube import Kube
from gpushare_common.events import DeviceHealth
from gpushare_common.ids import (
    ANN_DEVICE_OWNER,
    ANN_DEVICES_IDS,
    ANN_SHARE_KIND,
    ANN_SHARE_SPEC,
    CONDITION_USING,
    KIND_IDS,
    LABEL_POD_DESCRIPTION,
    SHADOW_POD_LABEL_VALUE,
    format_devices_ids,
    sign,
    signature_annotation,
)
from gpushare_common.mapping import IDLE_SPACE
from gpushare_common.pods import MANAGED_BY, SHADOW_CONTROLLER, PodRules
from gpushare_common.settings import NatsSettings
from gpushare_solver import app
from gpushare_solver.actions import DeviceList
from gpushare_solver.nodepods import read_pods
from gpushare_solver.rebuild import rebuild
from gpushare_solver.settings import SolverSettings
from gpushare_solver.state import SolverState
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.solver.conftest import NODE, wait_for
from tests.solver.fakes import FakeTasks
from tests.solver.test_integration import Recorder
from tests.solver.world import client_bus, common_settings
from tests.support.kubeapi import KubeApi

KEY = b"0123456789abcdef0123456789abcdef"
RULES = PodRules()
SYSTEM = "gpushare-system"
Obj = dict[str, Any]


def pod(key: str, phase: str = "Running", labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None, requests: dict[str, str] | None = None,
        conditions: list[Obj] | None = None) -> Obj:
    namespace, name = key.split("/")
    return {"metadata": {"namespace": namespace, "name": name, "labels": labels or {},
                         "annotations": annotations or {}},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox",
                                                       "resources": {"limits": requests or {}}}]},
            "status": {"phase": phase, "conditions": conditions or []}}


def shadow(key: str, spec: int = 2, kind: str = "share", users: dict[str, str] | None = None,
           phase: str = "Running") -> Obj:
    conditions = [{"type": CONDITION_USING, "status": "True" if users else "False",
                   "message": json.dumps(users or {})}]
    return pod(key, phase, labels={LABEL_POD_DESCRIPTION: SHADOW_POD_LABEL_VALUE, MANAGED_BY: SHADOW_CONTROLLER},
               annotations={ANN_SHARE_SPEC: str(spec), ANN_SHARE_KIND: kind},
               requests={"nvidia.com/gpu": "1"}, conditions=conditions)


def share(key: str, owner: str | None) -> Obj:
    return pod(key, annotations={ANN_DEVICE_OWNER: owner} if owner else {},
               requests={"gpushare/share-gpu-2": "1"})


def borrower(key: str, cards: list[str], key_bytes: bytes | None = KEY) -> Obj:
    value = format_devices_ids({"nvidia.com/gpu": cards})
    annotations = {ANN_DEVICES_IDS + "*": value}
    if key_bytes is not None:
        annotations[signature_annotation(KIND_IDS, "*")] = sign(key_bytes, KIND_IDS, NODE, "*", value)
    return pod(key, annotations=annotations, requests={"gpushare/spot-gpu": "1"})


def test_shadow_pods_and_their_users_from_the_using_condition() -> None:
    state = SolverState()
    pods = [
        shadow(f"{SYSTEM}/sh", users={f"{SYSTEM}/sh-0": "apps/a", f"{SYSTEM}/sh-1": "apps/b"}),
        shadow(f"{SYSTEM}/dev", spec=4, kind="share-dev", users={f"{SYSTEM}/dev-3": "apps/c"}),
        shadow(f"{SYSTEM}/pending", phase="Pending"),
        share("apps/a", f"{SYSTEM}/sh"),
        share("apps/b", None),  # the annotation not written yet: the condition is enough
        share("apps/c", f"{SYSTEM}/other"),  # names another ShadowPod: left to the detector
        share("apps/d", f"{SYSTEM}/sh"),  # the annotation alone does not say which device
    ]
    actions, found = rebuild(state, read_pods(pods, RULES, NODE), None)
    assert state.cache.snapshot() == {
        f"{SYSTEM}/dev": {f"{SYSTEM}/dev-{i}": "" for i in range(4)},
        f"{SYSTEM}/sh": {f"{SYSTEM}/sh-0": "apps/a", f"{SYSTEM}/sh-1": "apps/b"},
    }
    assert state.cache.get(f"{SYSTEM}/dev").resource == "share-dev-gpu-4"  # type: ignore[union-attr]
    assert actions == [
        DeviceList(resource="share-dev-gpu-4", devices=tuple(f"{SYSTEM}/dev-{i}" for i in range(4)),
                   reason="rebuilt from the cluster"),
        DeviceList(resource="share-gpu-2", devices=(f"{SYSTEM}/sh-0", f"{SYSTEM}/sh-1"),
                   reason="rebuilt from the cluster"),
    ]
    assert (found.shadow_pods, found.users, found.skipped) == (2, 2, {"user-of-another-shadow-pod": 1})


def test_a_terminating_shadow_pod_and_users_gone_or_finished() -> None:
    state = SolverState()
    deleting = shadow(f"{SYSTEM}/sh", users={f"{SYSTEM}/sh-0": "apps/gone", f"{SYSTEM}/sh-1": "apps/done"})
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    done = share("apps/done", f"{SYSTEM}/sh")
    done["status"]["phase"] = "Succeeded"
    actions, found = rebuild(state, read_pods([deleting, done], RULES, NODE), None)
    assert state.terminating == {f"{SYSTEM}/sh"} and state.cache.users_of(f"{SYSTEM}/sh") == set()
    assert actions == [DeviceList(resource="share-gpu-2", devices=(), reason="rebuilt from the cluster")]
    assert found.skipped == {"user-not-on-node": 2}


def test_borrowers_from_a_signed_allocate_annotation_only() -> None:
    state = SolverState()
    pods = [borrower("spot/b1", ["GPU-0", "GPU-1"]), borrower("spot/forged", ["GPU-2"], key_bytes=b"x" * 32),
            borrower("spot/plain", ["GPU-3"], key_bytes=None), pod("spot/noann", requests={"gpushare/spot-gpu": "1"}),
            borrower("spot/twice", ["GPU-1"])]
    actions, found = rebuild(state, read_pods(pods, RULES, NODE), KEY)
    assert actions == [] and found.borrowers == 2
    assert state.borrowers() == {"spot-GPU-0": "spot/b1", "spot-GPU-1": "spot/b1"}
    assert state.cache.snapshot()[IDLE_SPACE] == {"spot-GPU-0": "spot/b1", "spot-GPU-1": "spot/b1"}
    assert found.skipped == {"unsigned-or-malformed-allocate-annotation": 2,
                             "borrower-without-allocate-annotation": 1, "spot-device-claimed-twice": 1}
    assert state.health == {}  # desired health is not derived from pods


def test_pods_that_may_hold_cards_are_counted() -> None:
    pods = [shadow(f"{SYSTEM}/sh"), pod("dev/alice", requests={"nvidia.com/gpu": "1"}),
            pod("dev/rdma", requests={"example.com/hca": "1"}), share("apps/a", f"{SYSTEM}/sh"),
            borrower("spot/b1", ["GPU-0"]), pod("batch/x", requests={"gpushare/vcpu": "2", "cpu": "1"}),
            pod("web/y", requests={"memory": "1Gi", "hugepages-2Mi": "2Mi"})]
    _, found = rebuild(SolverState(), read_pods(pods, RULES, NODE), KEY)
    assert found.unknown_holders == 3  # the ShadowPod, the two pods with other extended resources


def test_without_the_node_key_borrowers_are_left_to_the_detector() -> None:
    state = SolverState()
    _, found = rebuild(state, read_pods([borrower("spot/b1", ["GPU-0"])], RULES, NODE), None)
    assert state.cache.snapshot() == {} and found.skipped == {"borrower-without-allocate-annotation": 1}


@pytest.mark.parametrize("bad", [
    pytest.param({ANN_SHARE_SPEC: "0"}, id="spec-zero"),
    pytest.param({ANN_SHARE_SPEC: "two"}, id="spec-text"),
    pytest.param({ANN_SHARE_KIND: "mig"}, id="unknown-kind"),
])
def test_a_malformed_shadow_pod_is_skipped(bad: dict[str, str]) -> None:
    state = SolverState()
    broken = shadow(f"{SYSTEM}/sh")
    broken["metadata"]["annotations"].update(bad)
    _, found = rebuild(state, read_pods([broken], RULES, NODE), None)
    assert state.cache.snapshot() == {} and found.skipped == {"malformed-pod": 1}


def test_a_pod_that_does_not_decode_is_counted_and_kept_present() -> None:
    """Nothing says a pod that does not decode finished: reconciliation keeps what the cache holds for it."""
    broken = shadow(f"{SYSTEM}/sh")
    broken["metadata"]["annotations"][ANN_SHARE_SPEC] = "two"
    done = share("apps/done", None)
    done["status"]["phase"] = "Succeeded"
    read = read_pods([broken, done, share("apps/a", None), {"metadata": {"name": "x"}}], RULES, NODE)
    assert read.present() == {f"{SYSTEM}/sh", "apps/a"}
    assert [e.pod for e in read.malformed] == [f"{SYSTEM}/sh", "?"]
    _, found = rebuild(SolverState(), read, None)
    assert found.skipped == {"malformed-pod": 2}


def test_a_using_condition_that_does_not_read_gives_no_users() -> None:
    state = SolverState()
    broken = shadow(f"{SYSTEM}/sh", users={f"{SYSTEM}/sh-0": "apps/a"})
    broken["status"]["conditions"][0]["message"] = "[not, json"
    _, found = rebuild(state, read_pods([broken, share("apps/a", f"{SYSTEM}/sh")], RULES, NODE), None)
    assert state.cache.snapshot() == {f"{SYSTEM}/sh": {f"{SYSTEM}/sh-0": "", f"{SYSTEM}/sh-1": ""}}
    assert found.shadow_pods == 1 and found.users == 0


def test_a_tenants_fake_shadow_pod_is_no_owner() -> None:
    """The ShadowPod label in a tenant's namespace grants nothing: a rebuild makes no owner of it,
    and its "users" are not its users."""
    state = SolverState()
    fake = shadow("mallory/sh", users={"mallory/sh-0": "apps/a"})
    _, found = rebuild(state, read_pods([fake, share("apps/a", "mallory/sh")], RULES, NODE), None)
    assert state.cache.snapshot() == {} and found.skipped == {"forged-shadow-pod": 1}


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=3), max_leaves=10)
FIELDS = st.sampled_from(["metadata", "spec", "status", "labels", "annotations", "conditions", "containers",
                          "phase", "message", "type", "resources", "limits", LABEL_POD_DESCRIPTION,
                          ANN_SHARE_SPEC, ANN_DEVICES_IDS + "*", CONDITION_USING, "Running"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.dictionaries(FIELDS, JSONISH, max_size=4),
    st.builds(lambda k, v: {**shadow(f"{SYSTEM}/sh"), k: v}, FIELDS, JSONISH),
    st.builds(lambda v: {**shadow(f"{SYSTEM}/sh"), "status": {"phase": "Running", "conditions": v}}, JSONISH),
    st.builds(lambda v: {**borrower("spot/b", ["GPU-0"]), "metadata": {
        "namespace": "spot", "name": "b", "annotations": {ANN_DEVICES_IDS + "*": v}}}, st.text(max_size=30)),
), max_size=5))
def test_any_pod_shape_is_rebuilt_or_skipped_never_raises(pods: list[Obj]) -> None:
    state = SolverState()
    rebuild(state, read_pods(pods, RULES, NODE), KEY)
    for owner, devices in state.cache.snapshot().items():
        assert all(isinstance(d, str) and isinstance(u, str) for d, u in devices.items()), owner


async def test_the_solver_rebuilds_an_empty_bucket_from_the_api(
    nats_settings: NatsSettings, kube_api: KubeApi, kube: Kube, tmp_path: Path,
) -> None:
    key_file = tmp_path / "node.key"
    key_file.write_bytes(KEY)
    for body in (shadow(f"{SYSTEM}/sh", users={f"{SYSTEM}/sh-1": "apps/a"}), share("apps/a", f"{SYSTEM}/sh"),
                 borrower("spot/b1", ["GPU-0"]), share("apps/late", f"{SYSTEM}/sh")):
        meta = body["metadata"]
        await kube.create_pod(meta["namespace"], {k: v for k, v in body.items() if k != "status"})
        await kube.patch_pod_status(meta["namespace"], meta["name"], {"status": body["status"]}, strategic=False)
    elsewhere = shadow(f"{SYSTEM}/other-node")
    elsewhere["spec"]["nodeName"] = "node-b"
    await kube.create_pod(SYSTEM, {k: v for k, v in elsewhere.items() if k != "status"})
    await kube.patch_pod_status(SYSTEM, "other-node", {"status": elsewhere["status"]}, strategic=False)
    settings_ = SolverSettings(signing_key_file=str(key_file))
    common = common_settings(nats_settings, Path(kube_api.kubeconfig), NODE)
    stop = asyncio.Event()
    async with client_bus(nats_settings) as bus:
        seen = Recorder()
        await bus.subscribe(bus.subjects.node_health(NODE), seen)
        async with app.Service(common, settings_, stop, pods=kube, tasks_api=FakeTasks()).started() as running:
            assert running.solver.state.cache.snapshot() == {
                IDLE_SPACE: {"spot-GPU-0": "spot/b1"},
                f"{SYSTEM}/sh": {f"{SYSTEM}/sh-0": "", f"{SYSTEM}/sh-1": "apps/a"}}
            holdoff_end = running.solver.state.lend_after
            assert holdoff_end >= time.time() + settings_.rebuild_holdoff_s - 30
            await wait_for(lambda: seen.of(DeviceHealth), what="the share device list published")
            health = seen.of(DeviceHealth)[0]
            assert isinstance(health, DeviceHealth) and health.resource == "share-gpu-2" and health.full
            assert set(health.devices) == {f"{SYSTEM}/sh-0", f"{SYSTEM}/sh-1"}
            stop.set()
        await kube.delete_pod("apps", "a", grace_seconds=0)  # gone while the solver was down
        stop = asyncio.Event()
        async with app.Service(common, settings_, stop, pods=kube, tasks_api=FakeTasks()).started() as again:
            assert not again.solver.rebuild_needed  # the bucket was written: loaded, then reconciled
            assert again.solver.state.cache.snapshot()[f"{SYSTEM}/sh"] == {f"{SYSTEM}/sh-0": "", f"{SYSTEM}/sh-1": ""}
            assert again.solver.state.lend_after == holdoff_end  # kept in the journal
            stop.set()
