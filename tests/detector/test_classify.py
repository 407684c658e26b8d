from __future__ import annotations

import copy
from typing import Any

import pytest
from gpushare_detector.classify import ClassifyError, PodClass, Rules, ShareSpec, classify
from hypothesis import given
from hypothesis import strategies as st

from tests.detector import podfactory as pf

RULES = Rules(vendor_resources=("nvidia.com/gpu", "hygon.com/dcu"))


@pytest.mark.parametrize(
    ("pod", "cls", "lendable"),
    [
        (pf.shadow("s1"), PodClass.SHADOW, False),
        (pf.share("a"), PodClass.SHARE, False),
        (pf.share("b", resource="gpushare/share-dev-gpu-8"), PodClass.SHARE, False),
        (pf.spot("c"), PodClass.SPOT, False),
        (pf.reserved("d"), PodClass.RESERVED, False),
        (pf.reserved("e", lendable=True), PodClass.RESERVED, True),
        (pf.pod("f", requests={"main": {"hygon.com/dcu": "2"}}), PodClass.RESERVED, False),
        (pf.pod("g", requests={"main": {"gpushare/vcpu": "4"}}), PodClass.BATCH, False),
        (pf.pod("h", requests={"main": {"cpu": "1"}}), PodClass.ORDINARY, False),
        (pf.pod("i", requests={"main": {"amd.com/gpu": "1"}}), PodClass.ORDINARY, False),
        (pf.pod("j", requests={"main": {"nvidia.com/gpu": "1"}},
                annotations={"gpushare.k8s.io/lendable": "true"}), PodClass.RESERVED, True),
        (pf.pod("k", requests={"main": {"nvidia.com/gpu": "1"}},
                labels={"gpushare.k8s.io/lendable": "no"}), PodClass.RESERVED, False),
        # a ShadowPod asks for a vendor card but is never a reserved pod
        (pf.pod("s2", requests={"main": {"nvidia.com/gpu": "1"}},
                labels={**pf.SHADOW_LABEL, "gpushare.k8s.io/lendable": "true"},
                annotations={"gpushare.k8s.io/share-spec": "2"}), PodClass.SHADOW, False),
        # share wins over spot, spot over reserved
        (pf.pod("m", requests={"a": {"gpushare/share-gpu-2": "1"}, "b": {"gpushare/spot-gpu": "1"}}),
         PodClass.SHARE, False),
        (pf.pod("n", requests={"a": {"nvidia.com/gpu": "1"}, "b": {"gpushare/spot-gpu": "1"}}),
         PodClass.SPOT, False),
    ],
)
def test_classification_table(pod: dict[str, Any], cls: PodClass, lendable: bool) -> None:
    view = classify(pod, RULES)
    assert view.cls is cls
    assert view.lendable is lendable


def test_custom_lendable_key_and_domain() -> None:
    rules = Rules(domain="acme", lendable_key="dev.acme/lend", lendable_value="yes")
    pod = pf.pod("x", requests={"main": {"nvidia.com/gpu": "1"}}, annotations={"dev.acme/lend": "yes"})
    assert classify(pod, rules).lendable
    assert classify(pf.pod("y", requests={"c": {"acme/spot-gpu": "1"}}), rules).cls is PodClass.SPOT
    assert classify(pf.spot("z"), rules).cls is PodClass.ORDINARY


def test_shadow_spec_and_state() -> None:
    view = classify(pf.shadow("s", spec=8, kind="share-dev", deleting=True), RULES)
    assert view.share == ShareSpec("share-dev", 8)
    assert view.share.resource == "share-dev-gpu-8"
    assert view.terminating
    assert classify(pf.shadow("t", phase="Succeeded"), RULES).finished


@pytest.mark.parametrize(
    ("pod", "reason"),
    [
        ({}, "no metadata"),
        ({"metadata": {"name": "a"}}, "non-empty"),
        ({"metadata": {"name": "a", "namespace": "n"}, "spec": {"containers": "x"}}, "must be a list"),
        ({"metadata": {"name": "a", "namespace": "n"}, "spec": {"containers": [{"image": "x"}]}}, "name"),
        (pf.shadow("s", spec=0), "share-spec"),
        (pf.pod("s", labels=pf.SHADOW_LABEL, annotations={"gpushare.k8s.io/share-spec": "x"}), "share-spec"),
        (pf.shadow("s", kind="huge"), "share-kind"),
    ],
)
def test_malformed_pods_are_typed_errors(pod: dict[str, Any], reason: str) -> None:
    with pytest.raises(ClassifyError, match=reason):
        classify(pod, RULES)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=20,
)


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

    examples = [pf.shadow("p"), pf.share("p"), pf.spot("p"), pf.reserved("p")]
    bases = st.sampled_from(examples).map(copy.deepcopy)
    return st.builds(mutate, bases, st.sampled_from(paths), json_values)


@given(_mutations())
def test_any_json_is_a_view_or_a_classify_error(pod: dict[str, Any]) -> None:
    try:
        classify(pod, RULES)
    except ClassifyError:
        pass
