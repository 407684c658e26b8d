"""Unit and property tests of the emulator's parsers and patch functions."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from gpushare_sim.apiserver import Store, objects
from gpushare_sim.apiserver.errors import ApiError
from gpushare_sim.apiserver.kinds import PODS
from gpushare_sim.apiserver.patch import (
    PatchError,
    apply_patch,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)
from gpushare_sim.apiserver.schema import SchemaError, check
from gpushare_sim.apiserver.selectors import (
    FieldTerm,
    Requirement,
    SelectorError,
    labels_match,
    parse_field_selector,
    parse_label_selector,
)
from gpushare_sim.apiserver.store import Selection
from hypothesis import given
from hypothesis import strategies as st

from tests.support.kubeapi import pod_manifest

# --- label selectors -------------------------------------------------------------

name_part = st.from_regex(r"[a-z0-9]([a-z0-9._-]{0,10}[a-z0-9])?", fullmatch=True)
label_key = st.one_of(name_part, st.builds(lambda p, n: f"{p}.io/{n}", name_part.filter(
    lambda s: "." not in s and "_" not in s), name_part))
label_value = st.one_of(st.just(""), name_part)


@st.composite
def requirements(draw: st.DrawFn) -> Requirement:
    key = draw(label_key)
    op = draw(st.sampled_from(["=", "!=", "in", "notin", "exists", "!", "gt", "lt"]))
    if op in ("exists", "!"):
        return Requirement(key, op)
    if op in ("gt", "lt"):
        return Requirement(key, op, (str(draw(st.integers(-1000, 1000))),))
    if op in ("in", "notin"):
        values = draw(st.lists(label_value, min_size=1, max_size=3))
        return Requirement(key, op, tuple(sorted(set(values))))
    return Requirement(key, op, (draw(label_value),))


@given(st.lists(requirements(), max_size=4))
def test_label_selector_round_trip(reqs: list[Requirement]) -> None:
    text = ",".join(req.render() for req in reqs)
    assert parse_label_selector(text) == tuple(reqs)


@given(st.text(max_size=30))
def test_label_selector_parser_only_raises_selector_errors(text: str) -> None:
    try:
        parse_label_selector(text)
    except SelectorError as error:
        assert error.selector == text


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("app=x", {"app": "x"}, True),
        ("app==x", {"app": "y"}, False),
        ("app!=x", {}, True),
        ("app in (x, y), tier", {"app": "y", "tier": ""}, True),
        ("app notin (x)", {"app": "x"}, False),
        ("!app", {"other": "1"}, True),
        ("count>3", {"count": "4"}, True),
        ("count<3", {"count": "x"}, False),
        ("gpushare.k8s.io/kind=shadow", {"gpushare.k8s.io/kind": "shadow"}, True),
        ("", {"any": "thing"}, True),
    ],
)
def test_label_selector_matching(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert labels_match(parse_label_selector(selector), labels) is expected


@pytest.mark.parametrize(
    "selector", ["a in (b", "=x", "a==", "a b", "a,", "Bad Key=x", "a=b c", "a>x", "-a=b", "a in b"]
)
def test_bad_label_selectors(selector: str) -> None:
    if selector == "a==":  # an empty value is allowed
        assert parse_label_selector(selector) == (Requirement("a", "=", ("",)),)
        return
    with pytest.raises(SelectorError):
        parse_label_selector(selector)


# --- field selectors -------------------------------------------------------------

field_terms = st.builds(
    FieldTerm,
    st.sampled_from(["spec.nodeName", "metadata.name", "status.phase", "involvedObject.name"]),
    st.text(max_size=12),
    st.booleans(),
)


@given(st.lists(field_terms, min_size=1, max_size=4))
def test_field_selector_round_trip(terms: list[FieldTerm]) -> None:
    text = ",".join(term.render() for term in terms)
    assert parse_field_selector(text) == tuple(terms)


@given(st.text(max_size=30))
def test_field_selector_parser_only_raises_selector_errors(text: str) -> None:
    try:
        parse_field_selector(text)
    except SelectorError as error:
        assert error.selector == text


def test_field_selector_forms() -> None:
    assert parse_field_selector("spec.nodeName==n1,status.phase!=Failed") == (
        FieldTerm("spec.nodeName", "n1"),
        FieldTerm("status.phase", "Failed", negate=True),
    )
    assert parse_field_selector("") == ()
    for bad in ("spec.nodeName", "=x", "a=b\\q"):
        with pytest.raises(SelectorError):
            parse_field_selector(bad)


# --- patches ---------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=10,
)
json_objects = st.dictionaries(st.text(max_size=4), json_values, max_size=4)


def _no_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _no_nulls(v) for k, v in value.items() if v is not None}
    return value


@given(json_objects, json_objects)
def test_merge_patch_properties(target: dict[str, Any], patch: dict[str, Any]) -> None:
    before = copy.deepcopy(target)
    result = merge_patch(target, patch)
    assert target == before  # the input is never modified
    assert merge_patch(result, patch) == result  # idempotent
    for key, value in patch.items():
        if value is None:
            assert key not in result
        elif not isinstance(value, dict):
            assert result[key] == _no_nulls(value) or isinstance(value, list)


def test_merge_patch_rfc7386_example() -> None:
    target = {"title": "Goodbye!", "author": {"givenName": "John", "familyName": "Doe"},
              "tags": ["example", "sample"], "content": "This will be unchanged"}
    patch = {"title": "Hello!", "phoneNumber": "+01-123-456-7890",
             "author": {"familyName": None}, "tags": ["example"]}
    assert merge_patch(target, patch) == {
        "title": "Hello!", "author": {"givenName": "John"}, "tags": ["example"],
        "content": "This will be unchanged", "phoneNumber": "+01-123-456-7890",
    }


def test_strategic_merge_by_key_and_directives() -> None:
    pod = {
        "metadata": {"finalizers": ["a"]},
        "spec": {"containers": [{"name": "main", "image": "v1"}, {"name": "dind", "image": "d"}]},
        "status": {"conditions": [{"type": "Ready", "status": "False"},
                                  {"type": "gpushare.k8s.io/Using", "status": "True"}]},
    }
    patch = {
        "metadata": {"finalizers": ["b", "a"]},
        "spec": {"containers": [{"name": "main", "image": "v2"}, {"name": "dind", "$patch": "delete"}],
                 "$setElementOrder/containers": [{"name": "main"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"},
                                  {"type": "gpushare.k8s.io/Using", "$patch": "delete"}]},
    }
    result = strategic_merge_patch(pod, patch)
    assert result["metadata"]["finalizers"] == ["a", "b"]
    assert result["spec"]["containers"] == [{"name": "main", "image": "v2"}]
    assert result["status"]["conditions"] == [{"type": "Ready", "status": "True"}]
    replaced = strategic_merge_patch(pod, {"spec": {"$patch": "replace", "containers": []}})
    assert replaced["spec"] == {"containers": []}
    dropped = strategic_merge_patch(pod, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}})
    assert dropped["metadata"]["finalizers"] == []
    unkeyed = strategic_merge_patch({"args": ["a"]}, {"args": ["b"]})
    assert unkeyed == {"args": ["b"]}
    with pytest.raises(PatchError):
        strategic_merge_patch(pod, {"status": {"conditions": [{"status": "True"}]}})
    with pytest.raises(PatchError):
        strategic_merge_patch(pod, {"$patch": "explode"})


def test_json_patch_operations() -> None:
    doc = {"metadata": {"labels": {"a/b": "1"}}, "list": [1, 2]}
    ops = [
        {"op": "add", "path": "/list/-", "value": 3},
        {"op": "add", "path": "/list/0", "value": 0},
        {"op": "replace", "path": "/metadata/labels/a~1b", "value": "2"},
        {"op": "copy", "from": "/list/0", "path": "/first"},
        {"op": "move", "from": "/first", "path": "/moved"},
        {"op": "test", "path": "/moved", "value": 0},
        {"op": "remove", "path": "/list/1"},
    ]
    assert json_patch(doc, ops) == {
        "metadata": {"labels": {"a/b": "2"}}, "list": [0, 2, 3], "moved": 0
    }
    assert doc["list"] == [1, 2]
    for bad_ops, code in (
        ([{"op": "test", "path": "/list/0", "value": 9}], 422),
        ([{"op": "replace", "path": "/missing", "value": 1}], 422),
        ([{"op": "add", "path": "/list/9", "value": 1}], 422),
        ([{"op": "add", "path": "no-slash", "value": 1}], 400),
        ([{"op": "add", "path": "/x"}], 400),
        ({"op": "add"}, 400),
        (["remove"], 400),
    ):
        with pytest.raises(PatchError) as error:
            json_patch(doc, bad_ops)
        assert error.value.code == code


@given(json_objects, st.lists(st.fixed_dictionaries(
    {"op": st.sampled_from(["add", "remove", "replace", "move", "copy", "test", "x"]),
     "path": st.sampled_from(["", "/a", "/a/0", "/a/-", "/b/c", "/~1", "bad"])},
    optional={"value": json_values, "from": st.sampled_from(["/a", "/b", "/zz"])}), max_size=4))
def test_json_patch_only_raises_patch_errors(doc: dict[str, Any], ops: list[Any]) -> None:
    try:
        json_patch(doc, ops)
    except PatchError as error:
        assert error.code in (400, 422)


def test_unsupported_patch_type() -> None:
    with pytest.raises(PatchError) as error:
        apply_patch("application/apply-patch+yaml", {}, {})
    assert error.value.code == 415


# --- schema ----------------------------------------------------------------------


def test_schema_finds_unknown_fields_and_prunes_them() -> None:
    pod = {"metadata": {"name": "p", "colour": "red"},
           "spec": {"containers": [{"name": "main", "imag": "x",
                                    "resources": {"limits": {"cpu": 1}}}]}}
    assert check("V1Pod", copy.deepcopy(pod)) == ["metadata.colour", "spec.containers[0].imag"]
    check("V1Pod", pod, prune=True)
    assert pod == {"metadata": {"name": "p"},
                   "spec": {"containers": [{"name": "main", "resources": {"limits": {"cpu": 1}}}]}}


@pytest.mark.parametrize(
    "pod",
    [
        {"metadata": []},
        {"metadata": {"labels": {"a": 1}}},
        {"metadata": {"generation": "1"}},
        {"spec": {"hostNetwork": "yes"}},
        {"spec": {"containers": [{"name": True}]}},
    ],
)
def test_schema_rejects_wrong_types(pod: dict[str, Any]) -> None:
    with pytest.raises(SchemaError):
        check("V1Pod", pod)


# --- store: versions and replay ----------------------------------------------------

operations = st.lists(
    st.tuples(st.sampled_from(["create", "label", "delete"]), st.sampled_from(["a", "b", "c"])),
    max_size=25,
)


def _apply(store: Store, op: str, name: str) -> bool:
    target = objects.Target(PODS, "default", name)
    try:
        if op == "create":
            objects.create(store, PODS, "default", pod_manifest(name))
        elif op == "label":
            patch = {"metadata": {"labels": {"n": str(store.rv)}}}
            objects.patch(store, target, "application/merge-patch+json", patch)
        else:
            objects.delete(store, target, objects.DeleteOptions())
    except ApiError:
        return False
    return True


@given(operations, st.integers(0, 30), st.integers(1, 40))
def test_watch_replay_is_exactly_what_followed(
    ops: list[tuple[str, str]], since_offset: int, history: int
) -> None:
    store = Store(history=history)
    log: list[tuple[int, str, str]] = []  # (version, type, name) of every accepted write
    model: dict[str, int] = {}
    for op, name in ops:
        if _apply(store, op, name):
            kind = {"create": "ADDED", "label": "MODIFIED", "delete": "DELETED"}[op]
            log.append((store.rv, kind, name))
            if op == "delete":
                del model[name]
            else:
                model[name] = store.rv
    assert {e.obj["metadata"]["name"]: e.rv for e in store.select(Selection(PODS))} == model
    since = 1 + since_offset
    try:
        watcher, first = store.watch(Selection(PODS), since)
    except ApiError as error:
        assert error.code == 410 and since < store.compacted
        return
    replay = [json.loads(line) for line in first]
    got = [(int(e["object"]["metadata"]["resourceVersion"]), e["type"], e["object"]["metadata"]["name"])
           for e in replay]
    assert got == [entry for entry in log if entry[0] > since]
    store.unwatch(watcher)
