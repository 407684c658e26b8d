"""DRA device selectors, evaluated by a real CEL implementation (cel-python, ``celpy``) in the
environment Kubernetes gives them.

One variable, ``device``:

- ``device.driver`` (string), ``device.allowMultipleAllocations`` (bool);
- ``device.attributes["<domain>"].<name>``: string, int, bool, or a semantic version (a
  ``version`` attribute); a domain the device has no attribute of is an empty map, so
  ``has(device.attributes["<domain>"].<name>)`` and ``"<name>" in device.attributes["<domain>"]``
  test for an attribute;
- ``device.capacity["<domain>"].<name>``: a quantity.

Besides the standard CEL functions and macros (``size``, ``matches``, ``startsWith``, ``has``,
``all``, ``exists``, ...), Kubernetes' quantity library (``quantity("25")``, ``isQuantity``,
``q.compareTo(other)``, ``isGreaterThan``, ``isLessThan``, ``isInteger``, ``asInteger``,
``asApproximateFloat``, ``sign``, ``add``, ``sub``) and semver library (``semver("1.2.3")``,
``isSemver``, ``v.compareTo(other)``, ``isGreaterThan``, ``isLessThan``, ``major``, ``minor``,
``patch``).

Compiling refuses, with a :class:`CelError` naming the expression and why, what Kubernetes
refuses before any device is seen: a syntax error, a variable other than ``device``, a function
or method not declared here. A claim or class with such a selector stays unallocated with that
message. An expression that fails on a device (an attribute it does not have, a comparison of
a string with an int) or whose value is no bool matches no device: Kubernetes would fail the
claim with the error instead; guard with ``has()`` for the same meaning in both.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import celpy
import lark
import semver
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, CELUnsupportedError

from .cellib import LIBRARY, bounded, parse_semver

Value = str | int | bool
STANDARD = frozenset({"size", "contains", "startsWith", "endsWith", "matches", "int", "uint", "double",
                      "string", "bytes", "bool", "type", "duration", "timestamp"})  # fmt: skip
MACROS = frozenset({"has", "all", "exists", "exists_one", "map", "filter"})


class CelError(ValueError):
    """A selector Kubernetes would refuse: which and why."""

    def __init__(self, expression: str, reason: str) -> None:
        self.expression = expression
        self.reason = reason
        super().__init__(f"CEL selector {expression!r}: {reason}")


class Version(str):
    """A ``version`` attribute's value (a semantic version, compared as one in CEL)."""


@dataclass(frozen=True, slots=True)
class Device:
    """What a selector sees of one device."""

    driver: str
    attributes: Mapping[str, Value]  # qualified names (domain/name)
    multiple: bool = False
    capacity: Mapping[str, int | Decimal] = field(default_factory=dict)  # qualified names


# --- compiling: what Kubernetes checks before any device is seen -------------------------

_ENV = celpy.Environment()
DECLARED = STANDARD | MACROS | frozenset(LIBRARY)
VARIABLES = frozenset({"device", "int", "uint", "double", "string", "bytes", "bool", "list", "map", "type",
                       "null_type"})  # the one variable, and the type names
_SEEN = " (a selector sees 'device', the standard functions and macros, and the quantity and semver libraries)"


Node = lark.Tree[Any]


@dataclass(frozen=True, slots=True)
class Program:
    expression: str
    runner: celpy.Runner


def _idents(tree: Node) -> list[str]:
    return [str(c) for c in tree.children if isinstance(c, lark.Token)]


def _simple_name(expression: Node) -> str:
    """The identifier an argument is, or "" when it is anything else."""
    node = expression
    while isinstance(node, lark.Tree) and len(node.children) == 1 and node.data != "ident":
        node = node.children[0]
    return _idents(node)[0] if isinstance(node, lark.Tree) and node.data == "ident" else ""


def _macro(name: str, arguments: list[Node]) -> tuple[str, str]:
    """(what is wrong with a macro's arguments or "", the variable it binds)."""
    if name == "has":
        found = arguments[0] if len(arguments) == 1 else None
        while found is not None and found.data != "member_dot" and len(found.children) == 1:
            found = found.children[0] if isinstance(found.children[0], lark.Tree) else None
        return ("" if found is not None and found.data == "member_dot" else "has() takes one field selection"), ""
    variable = _simple_name(arguments[0]) if arguments else ""
    if len(arguments) != 2 or not variable:  # (cel-python has no map() with a filter)
        return f"{name}() takes a variable name and an expression", ""
    return "", variable


def _problems(tree: Node, bound: frozenset[str]) -> Iterator[str]:
    """What Kubernetes would refuse in the expression: undeclared names, malformed macros."""
    kind, names = tree.data, _idents(tree)
    trees = [c for c in tree.children if isinstance(c, lark.Tree)]
    called = kind in ("ident_arg", "member_dot_arg", "dot_ident_arg")
    if (kind == "ident" and names[0] not in bound) or (called and names[0] not in DECLARED):
        yield f"undeclared reference to {names[0]!r}{_SEEN}"
    elif kind in ("dot_ident", "member_object"):
        yield f"undeclared reference to a message type{_SEEN}"
    if names and names[0] in MACROS and kind in ("ident_arg", "member_dot_arg"):
        arguments = next((t.children for t in trees if t.data == "exprlist"), [])
        wrong, variable = _macro(names[0], [a for a in arguments if isinstance(a, lark.Tree)])
        if wrong:
            yield wrong
        bound = bound | {variable} if variable else bound
    for child in trees:
        yield from _problems(child, bound)


def compile_selector(expression: str) -> Program:
    """Parse and check one selector; :class:`CelError` when Kubernetes would refuse it."""
    if not isinstance(expression, str) or not expression.strip():
        raise CelError(str(expression), "empty expression")
    return _compile(expression)


@functools.lru_cache(maxsize=1024)  # a scheduler reads the same classes and claims again and again
def _compile(expression: str) -> Program:
    try:
        tree = _ENV.compile(expression)
    except CELParseError as err:
        detail = str(err.__context__ or "").strip().splitlines()
        raise CelError(expression, f"syntax error at column {err.column}" + (f": {detail[0]}" if detail else "")) \
            from None
    except RecursionError:
        raise CelError(expression, "nested too deeply") from None
    problem = next(_problems(tree, VARIABLES), None)
    if problem is not None:
        raise CelError(expression, problem)
    return Program(expression, _ENV.program(tree, LIBRARY))


# --- evaluating ------------------------------------------------------------------------


class _Domains(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: a domain without entries is an empty map."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType()


def _cel(value: Value | int) -> Any:
    if isinstance(value, Version):
        return parse_semver(value) if semver.Version.is_valid(value) else celtypes.StringType(value)
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    return celtypes.StringType(value)


def _by_domain(values: Mapping[str, Any], convert: Callable[[Any], Any]) -> _Domains:
    domains: dict[str, dict[celtypes.StringType, Any]] = {}
    for qualified, value in values.items():
        domain, _, name = qualified.rpartition("/")
        domains.setdefault(domain, {})[celtypes.StringType(name)] = convert(value)
    return _Domains({celtypes.StringType(d): celtypes.MapType(found) for d, found in domains.items()})


def _activation(device: Device) -> dict[str, Any]:
    return {"device": celtypes.MapType({
        celtypes.StringType("driver"): celtypes.StringType(device.driver),
        celtypes.StringType("attributes"): _by_domain(device.attributes, _cel),
        celtypes.StringType("capacity"): _by_domain(device.capacity, lambda amount: bounded(Decimal(amount))),
        celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(device.multiple),
    })}  # fmt: skip


def evaluate(program: Program, device: Device) -> bool:
    """Whether ``device`` satisfies the selector (an error on this device: it does not)."""
    return _verdict(program, device.driver, _typed(device.attributes), device.multiple, _typed(device.capacity))


Typed = frozenset[tuple[str, type, Any]]


def _typed(values: Mapping[str, Any]) -> Typed:
    """Values with their types, so that ``True`` and ``1``, a version and a string, differ as keys."""
    return frozenset((name, type(value), value) for name, value in values.items())


@functools.lru_cache(maxsize=65536)  # CEL has no side effects: the same device gets the same answer
def _verdict(program: Program, driver: str, attributes: Typed, multiple: bool, capacity: Typed) -> bool:
    device = Device(driver, {n: v for n, _, v in attributes}, multiple, {n: v for n, _, v in capacity})
    try:
        result = program.runner.evaluate(_activation(device))
    except (CELEvalError, CELUnsupportedError):
        return False
    return isinstance(result, celtypes.BoolType) and bool(result)
