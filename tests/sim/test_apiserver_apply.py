"""Server-side apply's field sets: what a configuration owns, FieldsV1 in and out,
removal of fields no longer applied, conflicts between appliers."""

from __future__ import annotations

from typing import Any

import pytest
from gpushare_sim.apiserver import apply
from gpushare_sim.apiserver.errors import ApiError
from hypothesis import given
from hypothesis import strategies as st

POD: dict[str, Any] = {
    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "1", "b": "2"}},
    "spec": {"containers": [{"name": "main", "image": "x", "args": ["1", "2"]}], "nodeName": "n"},
}  # fmt: skip


def test_field_set_of_a_pod() -> None:
    assert apply.field_set(POD) == {
        ("f:metadata", "f:labels", "f:a"), ("f:metadata", "f:labels", "f:b"), ("f:spec", "f:nodeName"),
        ("f:spec", "f:containers", 'k:{"name":"main"}', "."),
        ("f:spec", "f:containers", 'k:{"name":"main"}', "f:name"),
        ("f:spec", "f:containers", 'k:{"name":"main"}', "f:image"),
        ("f:spec", "f:containers", 'k:{"name":"main"}', "f:args"),
    }  # fmt: skip


keys = st.text(alphabet="abcdef", min_size=1, max_size=3)
configs = st.recursive(st.none() | st.integers() | st.text(max_size=3) | st.lists(st.integers(), max_size=2),
                       lambda inner: st.dictionaries(keys, inner, max_size=3), max_leaves=10)  # fmt: skip


@given(st.dictionaries(keys, configs, max_size=4))
def test_fieldsv1_round_trip(config: dict[str, Any]) -> None:
    paths = apply.field_set(config)
    assert apply.decode(apply.encode(paths)) == paths


def test_apply_removes_what_the_manager_dropped_and_keeps_others() -> None:
    first = apply.apply({}, POD, "me", force=False)
    shared = apply.apply(first, {**POD, "metadata": {"name": "p", "labels": {"c": "3"}}, "spec": {}}, "you", False)
    narrower = {**POD, "metadata": {"name": "p", "labels": {"a": "1"}}}
    result = apply.apply(shared, narrower, "me", force=False)
    assert result["metadata"]["labels"] == {"a": "1", "c": "3"}
    assert [e["manager"] for e in result["metadata"]["managedFields"]] == ["you", "me"]
    dropped = {**POD, "spec": {"containers": [], "nodeName": "n"}}
    assert apply.apply(result, dropped, "me", force=False)["spec"]["containers"] == []


def test_conflicts_and_force() -> None:
    mine = apply.apply({}, POD, "me", force=False)
    theirs = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "9"}}}
    with pytest.raises(ApiError) as error:
        apply.apply(mine, theirs, "you", force=False)
    assert error.value.code == 409 and 'conflict with "me": .metadata.labels.a' in error.value.message
    same_value = {**theirs, "metadata": {"name": "p", "labels": {"a": "1"}}}
    assert apply.apply(mine, same_value, "you", force=False)["metadata"]["labels"]["a"] == "1"  # co-owned
    taken = apply.apply(mine, theirs, "you", force=True)
    owners = {e["manager"]: apply.decode(e["fieldsV1"]) for e in taken["metadata"]["managedFields"]}
    assert ("f:metadata", "f:labels", "f:a") not in owners["me"]
    assert ("f:metadata", "f:labels", "f:a") in owners["you"] and taken["metadata"]["labels"]["a"] == "9"
