"""The one typed pod model: kinds, ShadowPods only where the platform makes them, bad input."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from gpushare_common.ids import ANN_DEVICES_IDS, KIND_IDS, signature_annotation
from gpushare_common.pods import (
    UNKNOWN,
    PodError,
    PodKind,
    PodRules,
    ShareSpec,
    SignedAnnotation,
    parse_share_resource,
    pod_key,
    read_pod,
    using_of,
)
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity as client_parse_quantity

from tests.detector import podfactory as pf

RULES = PodRules(vendor_resources=("nvidia.com/gpu", "hygon.com/dcu"))


@pytest.mark.parametrize(
    ("pod", "kind", "lendable"),
    [
        (pf.shadow("s1"), PodKind.SHADOW, False),
        (pf.share("a"), PodKind.SHARE, False),
        (pf.share("b", resource="gpushare/share-dev-gpu-8"), PodKind.SHARE, False),
        (pf.spot("c"), PodKind.SPOT, False),
        (pf.reserved("d"), PodKind.RESERVED, False),
        (pf.reserved("e", lendable=True), PodKind.RESERVED, True),
        (pf.pod("f", requests={"main": {"hygon.com/dcu": "2"}}), PodKind.RESERVED, False),
        (pf.pod("g", requests={"main": {"gpushare/vcpu": "4"}}), PodKind.BATCH, False),
        (pf.pod("h", requests={"main": {"cpu": "1"}}), PodKind.ORDINARY, False),
        (pf.pod("i", requests={"main": {"amd.com/gpu": "1"}}), PodKind.ORDINARY, False),
        (pf.pod("j", requests={"main": {"nvidia.com/gpu": "1"}},
                annotations={"gpushare.k8s.io/lendable": "true"}), PodKind.RESERVED, True),
        (pf.pod("k", requests={"main": {"nvidia.com/gpu": "1"}},
                labels={"gpushare.k8s.io/lendable": "no"}), PodKind.RESERVED, False),
        # a ShadowPod asks for a vendor card but is never a reserved pod
        (pf.pod("s2", namespace=pf.SYSTEM, requests={"main": {"nvidia.com/gpu": "1"}},
                labels={**pf.SHADOW_LABELS, "gpushare.k8s.io/lendable": "true"},
                annotations={"gpushare.k8s.io/share-spec": "2"}), PodKind.SHADOW, False),
        # the ShadowPod label in a tenant's namespace, or without the controller's label: not one
        (pf.shadow("fake", namespace="mallory"), PodKind.RESERVED, False),
        (pf.shadow("fake", labels=pf.SHADOW_LABEL), PodKind.RESERVED, False),
        # share wins over spot, spot over reserved
        (pf.pod("m", requests={"a": {"gpushare/share-gpu-2": "1"}, "b": {"gpushare/spot-gpu": "1"}}),
         PodKind.SHARE, False),
        (pf.pod("n", requests={"a": {"nvidia.com/gpu": "1"}, "b": {"gpushare/spot-gpu": "1"}}),
         PodKind.SPOT, False),
    ],
)
def test_classification_table(pod: dict[str, Any], kind: PodKind, lendable: bool) -> None:
    view = read_pod(pod, RULES)
    assert view.kind is kind
    assert view.lendable is lendable


def test_custom_lendable_key_and_domain() -> None:
    rules = PodRules(domain="acme", lendable_key="dev.acme/lend", lendable_value="yes")
    pod = pf.pod("x", requests={"main": {"nvidia.com/gpu": "1"}}, annotations={"dev.acme/lend": "yes"})
    assert read_pod(pod, rules).lendable
    assert read_pod(pf.pod("y", requests={"c": {"acme/spot-gpu": "1"}}), rules).kind is PodKind.SPOT
    assert read_pod(pf.spot("z"), rules).kind is PodKind.ORDINARY


def test_shadow_spec_and_state() -> None:
    view = read_pod(pf.shadow("s", spec=8, kind="share-dev", deleting=True), RULES)
    assert view.share == ShareSpec("share-dev", 8)
    assert view.share.resource == "share-dev-gpu-8"
    assert view.terminating
    assert read_pod(pf.shadow("t", phase="Succeeded"), RULES).finished


@pytest.mark.parametrize(
    ("pod", "reason"),
    [
        ({}, "no metadata"),
        ({"metadata": {"name": "a"}}, "non-empty"),
        ({"metadata": {"name": "a", "namespace": "n"}, "spec": {"containers": "x"}}, "must be a list"),
        ({"metadata": {"name": "a", "namespace": "n"}, "spec": {"containers": [{"image": "x"}]}}, "name"),
        (pf.shadow("s", spec=0), "share-spec"),
        (pf.pod("s", namespace=pf.SYSTEM, labels=pf.SHADOW_LABELS,
                annotations={"gpushare.k8s.io/share-spec": "x"}), "share-spec"),
        (pf.shadow("s", spec=7) | {"spec": {"priority": True, "containers": []}}, "priority"),
        (pf.shadow("s", kind="huge"), "share-kind"),
    ],
)
def test_malformed_pods_are_typed_errors(pod: dict[str, Any], reason: str) -> None:
    with pytest.raises(PodError, match=reason):
        read_pod(pod, RULES)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=20,
)


def _batch(requests: dict[str, Any], more: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pod whose ``main`` requests ``requests`` and whose ``side`` requests ``more``."""
    pod = pf.pod("p", requests={"main": {}, "side": {}})
    pod["spec"]["containers"][0]["resources"] = {"requests": requests}
    pod["spec"]["containers"][1]["resources"] = {"requests": more or {}}
    return pod


def _borrower(value: str = '{"nvidia.com/gpu":["GPU-0"]}', signature: str | None = "v2:00") -> dict[str, Any]:
    annotations = {ANN_DEVICES_IDS + "*": value}
    if signature is not None:
        annotations[signature_annotation(KIND_IDS, "*")] = signature
    return pf.spot("p", annotations=annotations)


def _mutations() -> st.SearchStrategy[dict[str, Any]]:
    """Valid pods with one part replaced by arbitrary JSON."""
    paths = [("metadata",), ("metadata", "labels"), ("metadata", "annotations"), ("metadata", "name"),
             ("spec",), ("spec", "containers"), ("spec", "priority"), ("status",), ("status", "phase")]

    def mutate(base: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
        target = base
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        return base

    examples = [pf.shadow("p"), pf.share("p"), pf.spot("p"), pf.reserved("p"), _batch({"gpushare/vmem": "2"}),
                _borrower()]
    bases = st.sampled_from(examples).map(copy.deepcopy)
    return st.builds(mutate, bases, st.sampled_from(paths), json_values)


@given(_mutations())
def test_any_json_is_a_pod_or_a_pod_error(pod: dict[str, Any]) -> None:
    try:
        view = read_pod(pod, RULES)
    except PodError as err:
        assert err.pod in (UNKNOWN, "ns/p", "gpushare-system/p")
    else:
        assert view.vcpu >= 0 and view.vmem >= 0
        assert all(isinstance(a.value, str) and isinstance(a.signature, str) for a in view.devices_ids.values())


def test_batch_requests_are_whole_devices_summed_over_containers() -> None:
    view = read_pod(_batch({"gpushare/vcpu": "2", "gpushare/vmem": 3, "cpu": "1"}, {"gpushare/vmem": " 4 "}), RULES)
    assert (view.kind, view.vcpu, view.vmem) == (PodKind.BATCH, 2, 7)
    assert (read_pod(_batch({"cpu": "1"}), RULES).vcpu, read_pod(_batch({"cpu": "1"}), RULES).vmem) == (0, 0)
    # limits are not requests (the API server copies an extended resource's limit into its request)
    assert read_pod(pf.pod("g", requests={"main": {"gpushare/vcpu": "4"}}), RULES).vcpu == 0
    acme = read_pod(_batch({"acme/vcpu": "5", "gpushare/vcpu": "1"}), PodRules(domain="acme"))
    assert acme.vcpu == 5
    with pytest.raises(PodError, match=r"gpushare/vmem request '1\.5': expected a whole number") as caught:
        read_pod(_batch({"gpushare/vmem": "1.5"}), RULES)
    assert caught.value.pod == "ns/p"
    # the API server writes a quantity back in its canonical form: 1000 is "1k", 2048 "2Ki"
    assert read_pod(_batch({"gpushare/vcpu": "1k", "gpushare/vmem": "2Ki"}), RULES).vcpu == 1000
    assert read_pod(_batch({"gpushare/vmem": "2Ki"}), RULES).vmem == 2048


@given(st.integers(min_value=0, max_value=10**17), st.integers(min_value=0, max_value=10**17))
def test_batch_requests_round_trip(vcpu: int, vmem: int) -> None:
    view = read_pod(_batch({"gpushare/vcpu": str(vcpu), "gpushare/vmem": vmem}), RULES)
    assert (view.vcpu, view.vmem) == (vcpu, vmem)


@given(st.one_of(json_values, st.floats(), st.integers(max_value=-1),
                 st.sampled_from(["1k", "01", "2Gi", "+1", "1e3", "500m", "2000m", "3Ki", "1.5", "1e19",
                                  "10000000000000000000"])))
def test_a_batch_request_is_a_whole_number_or_a_pod_error(value: Any) -> None:
    try:
        view = read_pod(_batch({"gpushare/vcpu": value}), RULES)
    except PodError as err:
        assert err.pod == "ns/p" and "gpushare/vcpu request" in err.reason
    else:  # the Kubernetes client's own reading of the quantity agrees, and it is a whole number
        assert isinstance(value, str | int) and not isinstance(value, bool)
        assert view.vcpu == client_parse_quantity(str(value).strip()) and 0 <= view.vcpu < 2**63


def test_the_allocate_annotations_are_read_with_their_signatures() -> None:
    view = read_pod(_borrower(), RULES)
    assert view.devices_ids == {"*": SignedAnnotation('{"nvidia.com/gpu":["GPU-0"]}', "v2:00")}
    assert read_pod(_borrower(signature=None), RULES).devices_ids == {
        "*": SignedAnnotation('{"nvidia.com/gpu":["GPU-0"]}', "")}
    assert read_pod(pf.spot("p"), RULES).devices_ids == {}


@given(st.dictionaries(st.sampled_from([ANN_DEVICES_IDS + "*", ANN_DEVICES_IDS + "main", "x",
                                        signature_annotation(KIND_IDS, "*"), signature_annotation(KIND_IDS, "x")]),
                       st.text(max_size=8), max_size=5))
def test_allocate_annotations_are_taken_as_written(annotations: dict[str, str]) -> None:
    view = read_pod(pf.spot("p", annotations=annotations), RULES)
    assert set(view.devices_ids) == {n[len(ANN_DEVICES_IDS):] for n in annotations if n.startswith(ANN_DEVICES_IDS)}
    for target, annotation in view.devices_ids.items():
        assert annotation.value == annotations[ANN_DEVICES_IDS + target]
        assert annotation.signature == annotations.get(signature_annotation(KIND_IDS, target), "")


def test_the_resources_of_a_pod_and_its_key() -> None:
    view = read_pod(pf.pod("p", requests={"a": {"nvidia.com/gpu": "1"}, "b": {"gpushare/spot-gpu": "1"}}), RULES)
    assert view.resources == {"nvidia.com/gpu", "gpushare/spot-gpu"}
    assert pod_key(pf.pod("p")) == "ns/p" == view.key
    with pytest.raises(PodError, match="non-empty") as caught:
        pod_key({"metadata": {"namespace": "ns"}})
    assert caught.value.pod == UNKNOWN


@given(st.lists(st.text(alphabet="abcdef0123456789", min_size=1, max_size=64), max_size=5),
       st.lists(st.text(alphabet="abcdef0123456789", min_size=1, max_size=64), max_size=3))
def test_container_ids_are_read_from_every_status_list(main: list[str], init: list[str]) -> None:
    pod = pf.pod("p")
    pod["status"] = {"containerStatuses": [{"name": f"m{i}", "containerID": f"containerd://{c}"}
                                           for i, c in enumerate(main)],
                     "initContainerStatuses": [{"name": f"i{i}", "containerID": f"containerd://{c}"}
                                               for i, c in enumerate(init)]}
    assert sorted(read_pod(pod, RULES).container_ids.values()) == sorted(main + init)


@given(st.recursive(st.none() | st.text(max_size=12) | st.integers(),
                    lambda children: st.lists(children, max_size=3) | st.dictionaries(
                        st.sampled_from(["containerStatuses", "initContainerStatuses", "containerID", "name"]),
                        children, max_size=3),
                    max_leaves=12))
def test_container_ids_of_any_status_shape_are_strings_taken_from_it(status: Any) -> None:
    pod = pf.pod("p")
    pod["status"] = status
    try:
        found = read_pod(pod, RULES).container_ids
    except PodError as err:
        assert not isinstance(status, dict) and status is not None and "status" in err.reason
        return
    assert all(isinstance(c, str) and c and any(t.endswith("://" + c) for t in _strings(status))
               for c in found.values())


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_a_forged_shadow_pod_is_flagged_and_grants_nothing() -> None:
    fake = read_pod(pf.shadow("fake", namespace="mallory"), RULES)
    assert fake.forged_shadow and fake.share is None and fake.using == {}
    assert not read_pod(pf.shadow("real"), RULES).forged_shadow
    elsewhere = PodRules(system_namespace="platform")
    assert read_pod(pf.shadow("s", namespace="platform"), elsewhere).kind is PodKind.SHADOW
    assert read_pod(pf.shadow("s"), elsewhere).kind is PodKind.RESERVED


def test_share_device_owner_container_ids_and_using() -> None:
    share = pf.share("app", annotations={"gpushare.k8s.io/device-owner": "gpushare-system/s1"})
    share["status"]["containerStatuses"] = [{"name": "app", "containerID": "containerd://abc"},
                                            {"name": "odd", "containerID": "nope"}, "junk"]
    view = read_pod(share, RULES)
    assert (view.device_owner, view.container_ids) == ("gpushare-system/s1", {"app": "abc"})
    shadow = pf.shadow("s1")
    shadow["status"]["conditions"] = [{"type": "gpushare.k8s.io/Using", "status": "True",
                                       "message": '{"gpushare-system/s1-0": "ns/app"}'}]
    assert read_pod(shadow, RULES).using == {"gpushare-system/s1-0": "ns/app"}


@pytest.mark.parametrize("conditions", [
    None, "x", [{"type": "gpushare.k8s.io/Using", "status": "False", "message": '{"d": "p"}'}],
    [{"type": "gpushare.k8s.io/Using", "status": "True", "message": "not json"}],
    [{"type": "gpushare.k8s.io/Using", "status": "True", "message": "[1, 2]"}],
    [{"type": "Ready", "status": "True", "message": '{"d": "p"}'}],
])
def test_a_using_condition_that_is_not_the_solvers_reads_as_free(conditions: Any) -> None:
    assert using_of(conditions) == {}


@pytest.mark.parametrize(("resource", "spec"), [
    ("gpushare/share-gpu-4", ShareSpec("share", 4)), ("gpushare/share-dev-gpu-16", ShareSpec("share-dev", 16)),
    ("gpushare/share-gpu-0", None), ("gpushare/share-gpu-04", None), ("gpushare/share-gpu-x", None),
    ("gpushare/share-tpu-4", None), ("acme/share-gpu-4", None), ("gpushare/share-gpu-1025", None),
    ("gpushare/spot-gpu", None),
])
def test_share_resources_parse_one_way(resource: str, spec: ShareSpec | None) -> None:
    assert parse_share_resource(resource, "gpushare") == spec
    if spec is not None:
        assert f"gpushare/{spec.resource}" == resource


@given(st.text(max_size=40))
def test_any_resource_name_parses_or_is_none(resource: str) -> None:
    spec = parse_share_resource(resource, "gpushare")
    assert spec is None or f"gpushare/{spec.resource}" == resource


def test_a_share_pod_asks_for_one_share_and_counts_its_devices() -> None:
    two = pf.pod("app", requests={"a": {"gpushare/share-gpu-4": "1"}, "b": {"gpushare/share-gpu-4": "2"}})
    view = read_pod(two, RULES)
    assert (view.kind, view.share, view.share_devices) == (PodKind.SHARE, ShareSpec("share", 4), 3)
    canonical = pf.pod("k", requests={"a": {"gpushare/share-gpu-4": "2000m"}, "b": {"gpushare/share-gpu-4": "1k"}})
    assert read_pod(canonical, RULES).share_devices == 1002


@pytest.mark.parametrize("amount", ["x", "0", "-1", "1.5", "500m", "1K", "", None, 1.0, True])
def test_a_share_request_that_is_no_positive_whole_number_is_refused(amount: Any) -> None:
    odd = pf.pod("odd", requests={"a": {"gpushare/share-dev-gpu-8": amount}})
    with pytest.raises(PodError, match="gpushare/share-dev-gpu-8 request") as caught:
        read_pod(odd, RULES)
    assert caught.value.pod == "ns/odd" and "counts whole devices" in caught.value.reason


def test_readiness_restarts_and_isolation() -> None:
    shadow = pf.shadow("s1")
    shadow["metadata"]["annotations"]["gpushare.k8s.io/isolation"] = "mps"
    shadow["status"]["conditions"] = [{"type": "Ready", "status": "False"},
                                      {"type": "gpushare.k8s.io/Using", "status": "True", "message": "{}"}]
    shadow["status"]["containerStatuses"] = [{"name": "main", "restartCount": 3}]
    view = read_pod(shadow, RULES)
    assert (view.isolation, view.ready, view.restarts) == ("mps", False, {"main": 3})
    assert view.conditions == {"Ready": "False", "gpushare.k8s.io/Using": "True"}
    shadow["status"]["conditions"][0]["status"] = "True"
    assert read_pod(shadow, RULES).ready
    opted = pf.share("app", annotations={"gpushare.k8s.io/isolation": "none"})
    assert read_pod(opted, RULES).isolation == "none"
    assert read_pod(pf.reserved("d", annotations={"gpushare.k8s.io/isolation": "mps"}), RULES).isolation == ""


@pytest.mark.parametrize("status", [
    {"conditions": "x", "containerStatuses": "y"},
    {"conditions": [None, {"type": 1, "status": "True"}, {"type": "Ready"}],
     "containerStatuses": [None, {"name": "main", "restartCount": "2"}, {"name": "b", "restartCount": True},
                           {"name": "c", "restartCount": -1}, {"restartCount": 1}]},
])
def test_odd_conditions_and_restart_counts_are_skipped(status: dict[str, Any]) -> None:
    pod = pf.shadow("s1")
    pod["status"].update(status)
    view = read_pod(pod, RULES)
    assert (view.conditions, view.restarts, view.ready) == ({}, {}, False)


def test_spot_users_reads_device_plugin_ids_and_spot_claims() -> None:
    from gpushare_common import dra

    claim = dra.cdi_device(dra.ROLE_SPOT, "0e7a1c52-1b1c-4f4e-9c55-0c9f3f1d2a10", "GPU-3").qualified
    node = {
        "spot/a": {"main": {RULES.spot_resource: ("spot-GPU-0",)}, "side": {}},
        "spot/b": {"main": {dra.CDI_KIND: (claim, "gpushare.k8s.io/gpu=garbled")}},
        "team/x": {"main": {"nvidia.com/gpu": ("GPU-1",)}},
        "share/s": {"main": {"gpushare/share-gpu-2": ("shadow-0",)}},
    }
    assert RULES.spot_users(node) == {"spot/a": ("spot-GPU-0",), "spot/b": ("spot-GPU-3",)}


@given(st.dictionaries(st.text(max_size=8), st.dictionaries(st.text(max_size=4), st.dictionaries(
    st.sampled_from(["gpushare/spot-gpu", "gpushare.k8s.io/gpu", "nvidia.com/gpu", "x"]),
    st.lists(st.text(max_size=12), max_size=3).map(tuple), max_size=3), max_size=2), max_size=4))
def test_spot_users_takes_any_answer_and_names_only_spot_holders(node: dict[str, Any]) -> None:
    users = RULES.spot_users(node)
    assert set(users) <= set(node)
    assert all(ids and all(i.startswith("spot-") or i in {d for c in node[p].values() for d in
                                                            c.get(RULES.spot_resource, ())} for i in ids)
               for p, ids in users.items())
