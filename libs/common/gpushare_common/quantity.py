"""Kubernetes quantities (``resource.Quantity``): the one parser every part uses.

The grammar, as the API server reads a quantity (leading and trailing blanks are dropped first,
as its JSON decoder does)::

    <quantity>     ::= <sign>? <number> <suffix>
    <number>       ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <suffix>       ::= "" | <binarySI> | <decimalSI> | ("e" | "E") <sign>? <digits>
    <binarySI>     ::= Ki | Mi | Gi | Ti | Pi | Ei             (powers of 1024)
    <decimalSI>    ::= n | u | m | k | M | G | T | P | E       (powers of 1000)

The value comes back exact (a :class:`~decimal.Decimal`, never a float); :func:`parse_count`
adds what a count of devices needs: a whole number, at least ``minimum``, at most 2^63-1 (an
``int64``, as the kubelet counts devices). A JSON integer is read as its digits. Anything else
is a :class:`QuantityError` naming what was read, the value and why.

Why not ``kubernetes.utils.parse_quantity``: it hands the number to ``Decimal`` as it is, so it
accepts what the API server refuses (``NaN``, ``Infinity``, ``1_000``, ``1e3k``), rounds long
numbers to 28 digits, and it lives in the Kubernetes client that only adapters may import.
The tests compare the two on the grammar both accept.
"""

from __future__ import annotations

import re
from decimal import Context, Decimal, Inexact, localcontext

_GRAMMAR = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<si>[KMGTPE]i|[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?",
    re.ASCII)  # fmt: skip
_DECIMAL_SI = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SI = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
MAX_EXPONENT = 2**31 - 1  # the API server reads an exponent as an int32
MAX_COUNT = 2**63 - 1
MAX_INT_BITS = 1024  # a JSON integer beyond this is no quantity (and too long to print)


class QuantityError(ValueError):
    """A value that is not the quantity asked for: what was read, the value, why."""

    def __init__(self, what: str, value: object, reason: str) -> None:
        self.what = what
        self.value = value
        self.reason = reason
        bits = value.bit_length() if isinstance(value, int) else 0
        shown = f"an integer of {bits} bits" if bits > MAX_INT_BITS else repr(str(value)[:80])
        super().__init__(f"{what} {shown}: {reason}")


def parse_quantity(value: object, what: str = "quantity") -> Decimal:
    """The exact value of a Kubernetes quantity (``2``, ``500m``, ``1.5Gi``, ``1e3``, ``-4k``)."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise QuantityError(what, value, "expected a quantity (a string such as 500m or 2Gi, or an integer)")
    if isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise QuantityError(what, value, "too large for a quantity")
        return Decimal(value)
    text = value.strip()
    found = _GRAMMAR.fullmatch(text)
    if found is None:
        raise QuantityError(what, value, "not a Kubernetes quantity (a number with an optional suffix: "
                                         "n u m k M G T P E, Ki Mi Gi Ti Pi Ei, or an exponent e3)")
    exponent = int(found["exponent"] or 0)
    if abs(exponent) > MAX_EXPONENT:
        raise QuantityError(what, value, f"the exponent is beyond ±{MAX_EXPONENT}")
    number = found["number"]
    digits = len(number) + 20  # room for the binary multiplier (2^60 < 10^19): never rounded
    with localcontext(Context(prec=digits, Emax=MAX_EXPONENT + digits, Emin=-MAX_EXPONENT - digits,
                              traps=[Inexact])) as exact:  # fmt: skip
        amount = Decimal(found["sign"] + number)
        si = found["si"]
        if si in _BINARY_SI:
            return exact.multiply(amount, 2 ** _BINARY_SI[si])
        return exact.scaleb(amount, exponent + _DECIMAL_SI.get(si or "", 0))


def parse_count(value: object, what: str = "count", minimum: int = 0) -> int:
    """A quantity whose value is a whole number from ``minimum`` to 2^63-1 (``3``, ``1k``, ``2Ki``,
    ``2000m``), as an int; :class:`QuantityError` otherwise."""
    amount = parse_quantity(value, what)
    if amount != amount.to_integral_value():
        raise QuantityError(what, value, "expected a whole number")
    if not minimum <= amount <= MAX_COUNT:
        bound = f"at least {minimum}" if amount < minimum else f"at most {MAX_COUNT}"
        raise QuantityError(what, value, f"expected a whole number {bound}")
    return int(amount)
