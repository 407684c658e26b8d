"""Unchanged pods on a DRA node (DRAExtendedResource, KEP-5004): a pod asking
``gpushare/share-gpu-4: 1`` is given a special claim of the class serving that resource, its
slot device of a card prepared as a share with its caps; cards' counters (KEP-4815) keep a
card to whole-card claims or to one share kind."""

from __future__ import annotations

from typing import Any

from gpushare_common import dra
from gpushare_common.settings import NatsSettings
from gpushare_dra_driver.slices import build_slices
from gpushare_sim.dra import extended
from gpushare_sim.dra.allocator import AllocationError, read_slices, usage
from gpushare_sim.dra.search import allocate
from gpushare_sim.node.model import PodClaim, PodError, parse_pod
from gpushare_sim.node.testing import wait_until
from hypothesis import given
from hypothesis import strategies as st

from tests.dra.builders import NODE, card
from tests.dra.harness import DraNode, dra_node
from tests.support.kubeapi import (
    KubeApi,
    kube_api,  # noqa: F401  (the fixture)
)

CLASSES = {c["metadata"]["name"]: c for c in dra.device_classes((4,), (2,), extended=True)}  # type: ignore[index]
Obj = dict[str, Any]


def test_classes_serve_gpushares_extended_resources() -> None:
    served = extended.class_of(CLASSES.values())
    assert served["gpushare/share-gpu-4"] == "share-gpu-4.gpushare.k8s.io"
    assert served["gpushare/share-dev-gpu-2"] == "share-dev-gpu-2.gpushare.k8s.io"
    assert served["gpushare/spot-gpu"] == dra.SPOT_CLASS
    assert served[f"{extended.IMPLICIT_PREFIX}{dra.EXCLUSIVE_CLASS}"] == dra.EXCLUSIVE_CLASS


def test_requests_are_named_after_the_container_and_the_resource_as_the_scheduler_names_them() -> None:
    pod = {"metadata": {"name": "p", "uid": "u1"}, "spec": {
        "initContainers": [{"name": "init", "resources": {"requests": {"cpu": "1"}}}],
        "containers": [{"name": "a", "resources": {"limits": {"gpushare/share-gpu-4": "2", "cpu": "1"}}},
                       {"name": "b", "resources": {"requests": {"memory": "1Gi"}}}]}}
    served = extended.class_of(CLASSES.values())
    assert extended.wanted(pod, served) == {"gpushare/share-gpu-4"}
    requests, mappings = extended.requests_and_mappings(pod, {"gpushare/share-gpu-4"}, served)
    assert requests == [{"name": "container-1-request-1", "exactly": {
        "deviceClassName": "share-gpu-4.gpushare.k8s.io", "allocationMode": "ExactCount", "count": 2}}]
    assert mappings == [{"containerName": "a", "resourceName": "gpushare/share-gpu-4",
                         "requestName": "container-1-request-1"}]
    claim = extended.special_claim(pod, requests)
    assert claim["metadata"]["generateName"] == "p-extended-resources-"
    assert extended.claim_of(pod, [{**claim, "metadata": {**claim["metadata"], "name": "p-extended-resources-x"}}])


def allocated(claim_name: str, results: list[Obj]) -> Obj:
    return {"metadata": {"name": claim_name, "uid": claim_name},
            "status": {"allocation": {"devices": {"results": results}}}}


def claim_of(class_name: str, capacity: dict[str, str] | None = None) -> Obj:
    exactly: Obj = {"deviceClassName": class_name, **({"capacity": {"requests": capacity}} if capacity else {})}
    return {"metadata": {"name": "new", "uid": "new"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": exactly}]}}}


def test_a_cards_counter_keeps_it_to_whole_card_claims_or_one_share_kind() -> None:
    slices = build_slices(NODE, dra.DRIVER, [card(0)], 100, set(), 1, (("share", 4), ("share-dev", 2)))
    assert [len(s["spec"].get("devices", [])) for s in slices] == [0, 3], "counters in a slice of their own"
    devices = read_slices(slices)
    share = claim_of(dra.SHARE_CLASS, {dra.SHARES: "25"})
    quarter = claim_of("share-gpu-4.gpushare.k8s.io")
    half_dev = claim_of("share-dev-gpu-2.gpushare.k8s.io")

    def fits(claim: Obj, taken: list[Obj]) -> list[Obj] | None:
        try:
            return allocate(claim, CLASSES, devices, usage(taken), [])
        except AllocationError:
            return None

    (slot,) = fits(quarter, []) or [None]
    assert slot is not None and slot["device"] == dra.slot_device_name(card(0).id, "share", 4)
    assert slot["consumedCapacity"] == {dra.SLOTS: "1"}
    held = [allocated(f"q{i}", [slot]) for i in range(3)]
    assert fits(quarter, held) is not None, "a slot device's counter is drawn once, however many slots it gives"
    assert fits(quarter, [*held, allocated("q3", [slot])]) is None, "four quarters fill it"
    assert fits(share, held) is None and fits(half_dev, held) is None, "the card serves quarters now"
    (whole,) = fits(share, []) or [None]
    assert whole is not None and fits(quarter, [allocated("s", [whole])]) is None


async def test_an_unchanged_sharepod_runs_on_a_dra_node(kube_api: KubeApi,  # noqa: F811
                                                       nats_settings: NatsSettings) -> None:
    async with dra_node(kube_api, nats_settings, gpus=2, extended_share_specs=(4,)) as node:
        await wait_until(node.slice_devices, 15, "the node's slices")
        for body in dra.device_classes((4,), (), extended=True):
            await node.create("/apis/resource.k8s.io/v1/deviceclasses", body)
        for name in ("q1", "q2"):
            await node.kube.create_pod("default", sharepod(name))
        for name in ("q1", "q2"):
            await node.running(name)
        statuses = [await status_of(node, name) for name in ("q1", "q2")]
        claims = {c["metadata"]["name"]: c for c in await node.claims()}
        devices = set()
        for status in statuses:
            assert status["requestMappings"] == [{"containerName": "main", "resourceName": "gpushare/share-gpu-4",
                                                  "requestName": "container-0-request-0"}]
            claim = claims[status["resourceClaimName"]]
            assert claim["metadata"]["annotations"] == {extended.ANNOTATION: "true"}
            devices |= {r["device"] for r in claim["status"]["allocation"]["devices"]["results"]}
        assert devices == {dra.slot_device_name("GPU-dra-node-0", "share", 4)}, "both quarters on one card"
        prepared = [c for c in node.driver.preparer.state.claims.values()]
        assert [c.roles for c in prepared] == [("share",), ("share",)]
        edits = prepared[0].spec["devices"][0]["containerEdits"]  # type: ignore[index]
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in edits["env"]
        for name in ("q1", "q2"):
            await node.kube.delete_pod("default", name)
        await wait_until(lambda: _none_left(node), 30, "pods gone, special claims deleted, specs removed")


def sharepod(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "busybox", "command": ["sleep", "3600"],
                "resources": {"limits": {"gpushare/share-gpu-4": "1"}}}]}}


async def status_of(node: DraNode, name: str) -> Obj:
    pod = await node.kube.get_pod("default", name)
    return dict(pod["status"]["extendedResourceClaimStatus"])


async def _none_left(node: DraNode) -> bool:
    gone = all([await node.phase(n) == "gone" for n in ("q1", "q2")])
    return gone and not await node.claims() and not node.driver.files.spec_names()


MAPPING = {"containerName": "main", "resourceName": "gpushare/share-gpu-4", "requestName": "container-0-request-0"}


def test_the_kubelet_reads_the_special_claim_and_leaves_its_resources_to_it() -> None:
    body = sharepod("q1")
    body["metadata"]["uid"] = "u1"
    body["status"] = {"extendedResourceClaimStatus": {"resourceClaimName": "q1-extended-resources-ab",
                                                      "requestMappings": [MAPPING]}}
    pod = parse_pod(body)
    (main,) = pod.containers
    assert main.resources == {} and main.claims == (("q1-extended-resources-ab", "container-0-request-0"),)
    assert pod.claims == (PodClaim("q1-extended-resources-ab", "q1-extended-resources-ab"),)
    assert parse_pod(sharepod("q2")).containers[0].resources == {"gpushare/share-gpu-4": 1}


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                        st.sampled_from(["resourceClaimName", "requestMappings", "containerName", "resourceName",
                                         "requestName", "x"]), inner, max_size=4), max_leaves=12))
def test_a_malformed_extended_resource_claim_status_is_a_pod_error_naming_it(value: object) -> None:
    body = sharepod("q1")
    body["status"] = {"extendedResourceClaimStatus": value}
    try:
        parse_pod(body)
    except PodError as err:
        assert "extendedResourceClaimStatus" in str(err)
