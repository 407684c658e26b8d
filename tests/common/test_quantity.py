"""Kubernetes quantities: the grammar of resource.Quantity, exact values, whole counts."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from gpushare_common.quantity import MAX_COUNT, QuantityError, parse_count, parse_quantity
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity as client_parse_quantity

DECIMAL_SI = {"": 0, "n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
BINARY_SI = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}


@pytest.mark.parametrize("text, expected", [
    ("0", "0"), ("1", "1"), ("007", "7"), ("+5", "5"), ("-5", "-5"), (" 4 ", "4"), (12, "12"), (-3, "-3"),
    ("500m", "0.5"), ("1.5", "1.5"), ("1.", "1"), (".5", "0.5"), ("100n", "0.0000001"), ("7u", "0.000007"),
    ("1k", "1000"), ("1M", "1000000"), ("2G", "2000000000"), ("1E", "1000000000000000000"),
    ("1Ki", "1024"), ("1.5Gi", "1610612736"), ("-2Mi", "-2097152"), ("0.5Ki", "512"),
    ("1e3", "1000"), ("1E3", "1000"), ("1e-3", "0.001"), ("1.5e+2", "150"), ("12e6", "12000000"),
])  # fmt: skip
def test_known_quantities(text: Any, expected: str) -> None:
    assert parse_quantity(text) == Decimal(expected)


@pytest.mark.parametrize("text, reason", [
    ("", "not a Kubernetes quantity"), ("x", "not a Kubernetes quantity"), ("1K", "not a Kubernetes"),
    ("1ki", "not a Kubernetes"), ("1KiB", "not a Kubernetes"), ("1e3k", "not a Kubernetes"),
    ("1e", "not a Kubernetes"), ("e3", "not a Kubernetes"), ("1e1.5", "not a Kubernetes"),
    ("NaN", "not a Kubernetes"), ("Infinity", "not a Kubernetes"), ("1_000", "not a Kubernetes"),
    ("0x10", "not a Kubernetes"), (".", "not a Kubernetes"), ("+", "not a Kubernetes"), ("1.2.3", "not a"),
    ("1 k", "not a Kubernetes"), ("--1", "not a Kubernetes"), ("١", "not a Kubernetes"),
    ("1e2147483648", "the exponent is beyond"), (1.5, "expected a quantity"), (True, "expected a quantity"),
    (None, "expected a quantity"), ([1], "expected a quantity"), (2**1100, "too large"),
])  # fmt: skip
def test_what_is_not_a_quantity_is_refused_saying_why(text: Any, reason: str) -> None:
    with pytest.raises(QuantityError, match="memory request") as caught:
        parse_quantity(text, "memory request")
    assert reason in caught.value.reason and caught.value.what == "memory request"


@st.composite
def quantities(draw: st.DrawFn, max_digits: int = 30) -> tuple[str, Fraction]:
    """A quantity of the grammar, written out, with its exact value computed apart."""
    sign = draw(st.sampled_from(["", "+", "-"]))
    whole = draw(st.text("0123456789", max_size=max_digits))
    fraction = draw(st.text("0123456789", max_size=max_digits))
    dot = draw(st.booleans()) if whole and not fraction else bool(fraction)
    if not whole and not fraction:
        whole = "0"
    number = whole + ("." + fraction if dot else "")
    value = Fraction(int(whole or "0")) + (Fraction(int(fraction), 10 ** len(fraction)) if fraction else 0)
    kind = draw(st.sampled_from(["decimal", "binary", "exponent"]))
    if kind == "decimal":
        suffix = draw(st.sampled_from(sorted(DECIMAL_SI)))
        value *= Fraction(10) ** DECIMAL_SI[suffix]
    elif kind == "binary":
        suffix = draw(st.sampled_from(sorted(BINARY_SI)))
        value *= 2 ** BINARY_SI[suffix]
    else:
        exponent = draw(st.integers(-40, 40))
        suffix = draw(st.sampled_from("eE")) + draw(st.sampled_from(["", "+"]) if exponent >= 0 else st.just("")) \
            + str(exponent)
        value *= Fraction(10) ** exponent
    return f"{sign}{number}{suffix}", -value if sign == "-" else value


@given(quantities())
def test_every_quantity_of_the_grammar_reads_to_its_exact_value(case: tuple[str, Fraction]) -> None:
    text, value = case
    assert Fraction(parse_quantity(text)) == value


@given(quantities(max_digits=4))  # the client computes with 28 digits
def test_the_kubernetes_client_reads_the_same_values(case: tuple[str, Fraction]) -> None:
    text, _ = case
    assert parse_quantity(text) == client_parse_quantity(text)


@given(st.one_of(st.text(max_size=16), st.text("0123456789.+-eEKkMmGgiTPnu ", max_size=12), st.integers(),
                 st.floats(), st.none(), st.booleans()))
def test_any_value_reads_or_is_refused(value: Any) -> None:
    try:
        result = parse_quantity(value)
    except QuantityError as err:
        assert err.value is value and err.reason
    else:
        assert isinstance(result, Decimal) and result.is_finite()


@given(quantities(), st.sampled_from(["K", "ki", "B", "e", "kk", "Ki1", "x", "m1", " 1", "_", "k3"]))
def test_a_quantity_with_a_foreign_suffix_is_refused(case: tuple[str, Fraction], junk: str) -> None:
    text, _ = case
    with pytest.raises(QuantityError, match="not a Kubernetes quantity"):
        parse_quantity(text + junk)


@given(st.integers(0, MAX_COUNT), st.sampled_from(["", "k", "M", "Ki", "Gi", "m", "e0", "e3"]))
def test_whole_counts_read_as_integers(number: int, suffix: str) -> None:
    scale = {"": 1, "k": 10**3, "M": 10**6, "Ki": 2**10, "Gi": 2**30, "m": Fraction(1, 1000), "e0": 1,
             "e3": 1000}[suffix]
    value = number * scale
    text = f"{number}{suffix}"
    if value != int(value):
        with pytest.raises(QuantityError, match="expected a whole number"):
            parse_count(text, "gpushare/vcpu request")
    elif value > MAX_COUNT:
        with pytest.raises(QuantityError, match=f"at most {MAX_COUNT}"):
            parse_count(text, "gpushare/vcpu request")
    else:
        assert parse_count(text, "gpushare/vcpu request") == value


@pytest.mark.parametrize("text, minimum, reason", [
    ("0", 1, "at least 1"), ("-1", 0, "at least 0"), ("1.5", 0, "a whole number"), ("500m", 0, "a whole number"),
    ("1e-3", 0, "a whole number"), ("8Ei", 0, f"at most {MAX_COUNT}"), ("1e19", 0, "at most"),
])  # fmt: skip
def test_counts_that_are_not_whole_or_out_of_range_are_refused(text: str, minimum: int, reason: str) -> None:
    with pytest.raises(QuantityError, match=reason):
        parse_count(text, "count", minimum)
    assert parse_count("2000m", "count", 1) == 2 and parse_count("0", "count") == 0
