"""Share caps as data: the template language, the vendor isolation entry, the signed caps."""

from __future__ import annotations

import json
from typing import Any

import pytest
from gpushare_common import isolation as iso
from hypothesis import given
from hypothesis import strategies as st

VALUES: dict[str, int | str | None] = {"n": 4, "k": 1, "card_memory_mib": 16384, "percent": 25,
                                       "shadow_dir": "/run/gpushare/isolation/ns_sh"}
numbers = st.sampled_from(["n", "k", "card_memory_mib", "percent"])


def expressions() -> st.SearchStrategy[str]:
    atoms = st.integers(0, 5000).map(str) | numbers
    return st.recursive(atoms, lambda inner: st.tuples(inner, st.sampled_from("+-*/"), inner).map(
        lambda t: f"({t[0]} {t[1]} {t[2]})"), max_leaves=6)


def python_value(text: str) -> int:
    code = text
    for name in sorted(VALUES, key=len, reverse=True):
        code = code.replace(name, str(VALUES[name]) if name != "shadow_dir" else "0")
    return int(eval(code.replace("/", "//"), {"__builtins__": {}}))  # digits and operators only


@given(expressions())
def test_arithmetic_is_integer_arithmetic_rounding_down(expression: str) -> None:
    template = iso.compile_template("{" + expression + "}")
    try:
        expected = python_value(expression)
    except ZeroDivisionError:
        with pytest.raises(ValueError, match="division by zero"):
            iso.render(template, VALUES)
        return
    if expected < 0:
        with pytest.raises(ValueError, match="negative"):
            iso.render(template, VALUES)
    else:
        assert iso.render(template, VALUES) == str(expected)


@given(st.text(max_size=40))
def test_any_template_text_compiles_or_says_why(text: str) -> None:
    try:
        template = iso.compile_template(text)
    except ValueError as err:
        assert str(err)
        return
    try:
        iso.render(template, VALUES)
    except ValueError as err:
        assert str(err)


@given(st.text(st.characters(blacklist_characters="{}"), max_size=40))
def test_text_without_fields_is_itself(text: str) -> None:
    assert iso.render(iso.compile_template(text), VALUES) == text


@pytest.mark.parametrize(("text", "rendered"), [
    ("0={card_memory_mib * k / n}M", "0=4096M"),
    ("{percent}", "25"),
    ("{shadow_dir}/pipe", "/run/gpushare/isolation/ns_sh/pipe"),
    ("{{literal}} {n}", "{literal} 4"),
    ("{ (card_memory_mib - 1024) / n }", "3840"),
])
def test_templates(text: str, rendered: str) -> None:
    assert iso.render(iso.compile_template(text), VALUES) == rendered


@pytest.mark.parametrize(("text", "reason"), [
    ("{memory}", "unknown variable 'memory'"),
    ("{shadow_dir * 2}", "shadow_dir is text"),
    ("{n", "'{' without its '}'"),
    ("n}", "a single '}'"),
    ("{}", "empty {}"),
    ("{n +}", "ends too early"),
    ("{(n}", "ends too early"),
    ("{n $ 2}", "unexpected '$'"),
    ("{n 2}", "unexpected '2'"),
])
def test_bad_templates_say_why(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason.replace("(", r"\(").replace("$", r"\$")):
        iso.compile_template(text)


def test_unknown_card_memory_cannot_be_computed() -> None:
    profile = iso.parse_isolation("t", "isolation", iso.NVIDIA_MPS)
    with pytest.raises(iso.IsolationError, match="card_memory_mib is not known") as caught:
        iso.compute(profile, {**VALUES, "card_memory_mib": None}, "annotation")
    assert caught.value.field == "isolation 'mps' env.CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"


# --- the vendor table's isolation entry -------------------------------------------------

def entry(**changes: Any) -> dict[str, Any]:
    doc = json.loads(json.dumps(iso.NVIDIA_MPS))
    doc.update(changes)
    return doc


@pytest.mark.parametrize(("doc", "field", "reason"), [
    ("mps", "vendors.isolation", "expected 'none' or an object"),
    (entry(name="none"), "vendors.isolation.name", "not 'none'"),
    (entry(name="mps 2"), "vendors.isolation.name", "letters, digits and _"),
    (entry(extra=1), "vendors.isolation", "unknown keys ['extra']"),
    (entry(env=["A=1"]), "vendors.isolation.env", "expected an object"),
    (entry(env={"A-B": "1"}), "vendors.isolation.env", "bad variable name 'A-B'"),
    (entry(env={"A": "{nn}"}), "vendors.isolation.env.A", "unknown variable 'nn'"),
    (entry(env={"A": 5}), "vendors.isolation.env.A", "expected a template string"),
    (entry(mounts={}), "vendors.isolation.mounts", "expected a list"),
    (entry(mounts=[{"source": "/a"}]), "vendors.isolation.mounts[0].destination", "absolute path"),
    (entry(mounts=[{"source": "/a", "destination": "/x/../etc"}]),
     "vendors.isolation.mounts[0].destination", "absolute path"),
    (entry(mounts=[{"source": "/a", "destination": "/b", "options": ["ro"]}]),
     "vendors.isolation.mounts[0].options", "include bind or rbind"),
    (entry(mounts=[{"source": "/a", "destination": "/b", "type": "tmpfs"}]),
     "vendors.isolation.mounts[0].type", "only bind mounts"),
    (entry(mounts=[{"source": "{k", "destination": "/b"}]),
     "vendors.isolation.mounts[0].source", "without its"),
])
def test_bad_isolation_entries_name_file_and_field(doc: object, field: str, reason: str) -> None:
    with pytest.raises(iso.IsolationError) as caught:
        iso.parse_isolation("/etc/gpushare/runtime.json", "vendors.isolation", doc)
    assert caught.value.source == "/etc/gpushare/runtime.json" and caught.value.field == field
    assert reason in caught.value.reason and "/etc/gpushare/runtime.json" in str(caught.value)


json_like = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=12),
                         lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(st.sampled_from(["name", "env", "mounts", "source",
                                                            "destination", "options", "x"]),
                                           inner, max_size=4), max_leaves=12)


@given(json_like)
def test_any_isolation_entry_parses_or_says_where(doc: object) -> None:
    try:
        profile = iso.parse_isolation("f.json", "vendors.isolation", doc)
    except iso.IsolationError as err:
        assert err.source == "f.json" and err.field.startswith("vendors.isolation")
    else:
        assert profile.soft == (doc == "none")


def test_none_is_the_soft_share() -> None:
    soft = iso.parse_isolation("f", "i", "none")
    assert soft.soft and soft.label == "soft share" and not soft.env and not soft.mounts
    assert iso.parse_isolation("f", "i", iso.NVIDIA_MPS).label == "mps"


# --- the signed share caps -------------------------------------------------------------

caps_values = st.builds(
    lambda n, k, memory, opt_out: iso.ShareCaps("mps", "nvidia.com/gpu", "gpushare-system/sh-1", n,
                                               min(k, n), memory, opt_out),
    st.integers(1, 64), st.integers(1, 64), st.none() | st.integers(1, 1 << 20), st.booleans())


@given(caps_values)
def test_share_caps_round_trip(caps: iso.ShareCaps) -> None:
    assert iso.parse_share_caps("a", iso.format_share_caps(caps)) == caps


@given(st.text(max_size=60) | json_like.map(json.dumps)
       | st.dictionaries(st.sampled_from(["profile", "resource", "shadow", "n", "k", "card_memory_mib",
                                          "opt_out"]), json_like, max_size=7).map(json.dumps))
def test_any_caps_value_parses_or_says_why(value: str) -> None:
    try:
        iso.parse_share_caps("gpushare.k8s.io/container-devices-isolation.*", value)
    except iso.IsolationError as err:
        assert err.source == "gpushare.k8s.io/container-devices-isolation.*"


@pytest.mark.parametrize(("doc", "field"), [
    ({"k": 5}, "k"), ({"k": 0}, "k"), ({"n": 0}, "n"), ({"n": True}, "n"),
    ({"profile": "none"}, "profile"), ({"shadow": "a/../b"}, "pod key"),
    ({"resource": "bad resource"}, "resource name"), ({"card_memory_mib": -1}, "card_memory_mib"),
    ({"opt_out": "yes"}, "opt_out"),
])
def test_bad_caps_name_the_field(doc: dict[str, object], field: str) -> None:
    base = {"profile": "mps", "resource": "nvidia.com/gpu", "shadow": "ns/sh", "n": 4, "k": 1}
    with pytest.raises(iso.IsolationError) as caught:
        iso.parse_share_caps("ann", json.dumps({**base, **doc}))
    assert caught.value.field == field


@pytest.mark.parametrize(("requested", "expected"), [(None, 50), ("10", 10), (" 50 ", 50)])
def test_compute_percentage_up_to_the_share(requested: object, expected: int) -> None:
    caps = iso.ShareCaps("mps", "nvidia.com/gpu", "ns/sh", 4, 2)
    assert iso.compute_percent(caps, requested, "pod") == expected


@pytest.mark.parametrize("requested", ["51", "0", "-5", "ten", "", 30, "1e2"])
def test_compute_percentage_beyond_the_share_is_refused(requested: object) -> None:
    caps = iso.ShareCaps("mps", "nvidia.com/gpu", "ns/sh", 4, 2)
    with pytest.raises(iso.IsolationError, match=r"\[1, 50\] \(its share: 2 of 4\)"):
        iso.compute_percent(caps, requested, "pod")
