"""Placements read from any annotation without raising, and survive their own round trip."""

from __future__ import annotations

from gpushare_shadow_controller.placement import ANYWHERE, Placement
from hypothesis import given
from hypothesis import strategies as st

labels = st.dictionaries(st.text(min_size=1, max_size=20), st.text(max_size=20), max_size=3)
scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=10)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@given(st.text(max_size=200) | st.none() | st.integers())
def test_any_annotation_reads_as_some_placement(value: object) -> None:
    assert isinstance(Placement.of_annotation(value), Placement)


@given(labels, st.dictionaries(st.text(max_size=8), json_values, max_size=2))
def test_a_placement_reads_back_from_its_annotation(selector: dict[str, str], required: dict[str, object]) -> None:
    placement = Placement.of(selector, required)
    assert Placement.of_annotation(placement.text) == placement
    assert placement.anywhere == (not selector and not required)


def test_what_serves_what() -> None:
    on_n1 = Placement.of({"kubernetes.io/hostname": "n1"}, {})
    pool = Placement.of({"pool": "a"}, {})
    assert ANYWHERE.serves(ANYWHERE, "") and pool.serves(ANYWHERE, "n9")
    assert ANYWHERE.serves(on_n1, "n1") and not ANYWHERE.serves(on_n1, "n2") and not ANYWHERE.serves(on_n1, "")
    assert pool.serves(pool, "") and not ANYWHERE.serves(pool, "n1")
    assert on_n1.hostname == "n1" and pool.hostname == "" and Placement.of({"kubernetes.io/hostname": "n1", "x": "y"},
                                                                          {}).hostname == ""  # fmt: skip
