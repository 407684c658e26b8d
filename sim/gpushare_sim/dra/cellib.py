"""Kubernetes' CEL libraries that DRA selectors may use, for cel-python: quantities
(k8s.io/apiserver/pkg/cel/library/quantity.go: ``quantity``, ``isQuantity``, ``compareTo``,
``isGreaterThan``, ``isLessThan``, ``isInteger``, ``asInteger``, ``asApproximateFloat``,
``sign``, ``add``, ``sub``) and semantic versions (semverlib.go: ``semver``, ``isSemver``,
``compareTo``, ``isGreaterThan``, ``isLessThan``, ``major``, ``minor``, ``patch``).

A quantity is read by :mod:`gpushare_common.quantity` and kept as Kubernetes keeps one (at
most 2^63-1 in magnitude, rounded up to the nano); a version by the ``semver`` package. A
function given what it has no overload for raises ``TypeError`` ("no such overload"), one
given a bad value ``ValueError``: cel-python makes both an evaluation error.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import ROUND_UP, Context, Decimal
from typing import Any

import semver
from celpy import celtypes
from gpushare_common import quantity


class Quantity:
    """A CEL ``Quantity`` (k8s.io/apiserver/pkg/cel/library/quantity.go's functions)."""

    __slots__ = ("value",)

    def __init__(self, value: Decimal) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            raise TypeError("no such overload")
        return self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"Quantity({self.value})"


class Semver:
    """A CEL ``Semver`` (k8s.io/apiserver/pkg/cel/library/semverlib.go's functions)."""

    __slots__ = ("version",)

    def __init__(self, version: semver.Version) -> None:
        self.version = version

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Semver):
            raise TypeError("no such overload")
        return bool(self.version == other.version)

    def __hash__(self) -> int:
        return hash(self.version)

    def __repr__(self) -> str:
        return f"Semver({self.version})"


NANO = Decimal("1e-9")
_EXACT = Context(prec=60)  # bounded quantities (below 2^63, to the nano) never round in it


def bounded(value: Decimal) -> Quantity:
    """As Kubernetes keeps a quantity: at most 2^63-1 in magnitude, rounded up to the nano."""
    if value.copy_abs() > quantity.MAX_COUNT:
        raise ValueError("a quantity is at most 2^63-1 in magnitude")
    return Quantity(value.quantize(NANO, rounding=ROUND_UP, context=_EXACT).normalize(_EXACT))


def _quantity(text: object) -> Quantity:
    try:
        return bounded(quantity.parse_quantity(str(text)))
    except quantity.QuantityError as err:
        raise ValueError(err.reason) from None


def _is_quantity(text: object) -> celtypes.BoolType:
    try:
        quantity.parse_quantity(str(text))
    except quantity.QuantityError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def parse_semver(text: object) -> Semver:
    return Semver(semver.Version.parse(str(text)))  # ValueError when it is no semantic version


def _is_semver(text: object) -> celtypes.BoolType:
    return celtypes.BoolType(semver.Version.is_valid(str(text)))


def _order(left: object, right: object) -> int:
    if isinstance(left, Quantity) and isinstance(right, Quantity):
        return (left.value > right.value) - (left.value < right.value)
    if isinstance(left, Semver) and isinstance(right, Semver):
        return int(left.version.compare(right.version))
    raise TypeError("no such overload")


def _amount(value: object) -> Decimal:
    if isinstance(value, Quantity):
        return value.value
    if isinstance(value, int) and not isinstance(value, bool):
        return Decimal(value)
    raise TypeError("no such overload")


def _add(target: object, other: object, sign: int) -> Quantity:
    if not isinstance(target, Quantity):
        raise TypeError("no such overload")
    return bounded(_EXACT.add(target.value, _EXACT.multiply(sign, _amount(other))))


def _of_quantity(function: Callable[[Decimal], Any]) -> Callable[[object], Any]:
    def method(target: object) -> Any:
        if not isinstance(target, Quantity):
            raise TypeError("no such overload")
        return function(target.value)
    return method


def _of_semver(part: str) -> Callable[[object], celtypes.IntType]:
    def method(target: object) -> celtypes.IntType:
        if not isinstance(target, Semver):
            raise TypeError("no such overload")
        return celtypes.IntType(getattr(target.version, part))
    return method


def _as_integer(value: Decimal) -> celtypes.IntType:
    if value != value.to_integral_value() or abs(value) > quantity.MAX_COUNT:
        raise ValueError("asInteger() requires an integer quantity that fits in int64")
    return celtypes.IntType(int(value))


LIBRARY: dict[str, Callable[..., Any]] = {
    "quantity": _quantity, "isQuantity": _is_quantity, "semver": parse_semver, "isSemver": _is_semver,
    "compareTo": lambda a, b: celtypes.IntType(_order(a, b)),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_order(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_order(a, b) < 0),
    "isInteger": _of_quantity(lambda v: celtypes.BoolType(v == v.to_integral_value())),
    "asInteger": _of_quantity(_as_integer),
    "asApproximateFloat": _of_quantity(lambda v: celtypes.DoubleType(float(v))),
    "sign": _of_quantity(lambda v: celtypes.IntType((v > 0) - (v < 0))),
    "add": lambda a, b: _add(a, b, 1), "sub": lambda a, b: _add(a, b, -1),
    "major": _of_semver("major"), "minor": _of_semver("minor"), "patch": _of_semver("patch"),
}  # fmt: skip
