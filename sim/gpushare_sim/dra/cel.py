"""The subset of CEL the sim scheduler evaluates in DRA device selectors.

Supported, over one ``device``:

- ``device.driver``; ``device.attributes["<domain>"].<name>`` (or ``["<name>"]``) for string,
  int, bool and version attributes; ``device.allowMultipleAllocations``;
- literals: strings (double or single quotes), integers, ``true``, ``false``, lists ``[a, b]``;
- ``==  !=  <  <=  >  >=`` (integers compare as numbers, strings as text), ``in`` a list,
  ``"<name>" in device.attributes["<domain>"]`` and ``has(device.attributes["<domain>"].<name>)``;
- ``&&  ||  !`` and parentheses.

An attribute the device does not have makes the comparison false (CEL would raise an error
that fails the allocation; guard with ``has()`` for the same meaning everywhere). Anything
else (capacity, ``matches``, macros, arithmetic, other variables) is refused when the
expression is compiled, with :class:`CelError` naming the expression and what is not
supported; a claim or class that uses it stays unallocated with that message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Value = str | int | bool
Lookup = Callable[[str], Value | None]  # qualified attribute name -> value (None: absent)
_SYMBOLS = ("==", "!=", "<=", ">=", "&&", "||", "<", ">", "!", "(", ")", "[", "]", ".", ",")
_DIGITS = frozenset("0123456789")
_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


class CelError(ValueError):
    """An expression outside the supported subset, or malformed: which and why."""

    def __init__(self, expression: str, reason: str) -> None:
        self.expression = expression
        self.reason = reason
        super().__init__(f"CEL selector {expression!r}: {reason}")


@dataclass(frozen=True, slots=True)
class Device:
    """What a selector sees of one device."""

    driver: str
    attributes: Mapping[str, Value]  # qualified names (domain/name)
    multiple: bool = False


def _string(text: str, start: int, expression: str) -> tuple[str, int]:
    quote, index, out = text[start], start + 1, []
    while index < len(text) and text[index] != quote:
        if text[index] == "\\" and index + 1 < len(text):
            index += 1
        out.append(text[index])
        index += 1
    if index >= len(text):
        raise CelError(expression, "unterminated string")
    return "".join(out), index + 1


def tokens(expression: str) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    index = 0
    while index < len(expression):
        char = expression[index]
        if char.isspace():
            index += 1
        elif char in "\"'":
            value, index = _string(expression, index, expression)
            found.append(("str", value))
        elif char in _DIGITS:
            end = index
            while end < len(expression) and expression[end] in _DIGITS:
                end += 1
            found.append(("int", int(expression[index:end])))
            index = end
        elif char in _WORD:
            end = index
            while end < len(expression) and expression[end] in _WORD:
                end += 1
            found.append(("name", expression[index:end]))
            index = end
        else:
            symbol = next((s for s in _SYMBOLS if expression.startswith(s, index)), None)
            if symbol is None:
                raise CelError(expression, f"unsupported character {char!r} at {index}")
            found.append(("sym", symbol))
            index += len(symbol)
    return found


class _Parser:
    """Recursive descent to a tree of tuples."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.tokens = tokens(expression)
        self.index = 0

    def fail(self, reason: str) -> CelError:
        return CelError(self.expression, reason)

    def peek(self) -> tuple[str, Any]:
        return self.tokens[self.index] if self.index < len(self.tokens) else ("end", None)

    def take(self, kind: str = "", value: Any = None) -> tuple[str, Any]:
        token = self.peek()
        if (kind and token[0] != kind) or (value is not None and token[1] != value):
            wanted = value if value is not None else kind
            raise self.fail(f"expected {wanted!r}, found {token[1]!r}" if token[0] != "end"
                            else f"expected {wanted!r}, found the end")
        self.index += 1
        return token

    def parse(self) -> tuple[Any, ...]:
        tree = self.disjunction()
        if self.peek()[0] != "end":
            raise self.fail(f"unsupported {self.peek()[1]!r} (not in the supported subset)")
        return tree

    def disjunction(self) -> tuple[Any, ...]:
        tree = self.conjunction()
        while self.peek() == ("sym", "||"):
            self.take()
            tree = ("or", tree, self.conjunction())
        return tree

    def conjunction(self) -> tuple[Any, ...]:
        tree = self.unary()
        while self.peek() == ("sym", "&&"):
            self.take()
            tree = ("and", tree, self.unary())
        return tree

    def unary(self) -> tuple[Any, ...]:
        if self.peek() == ("sym", "!"):
            self.take()
            return ("not", self.unary())
        return self.comparison()

    def comparison(self) -> tuple[Any, ...]:
        left = self.operand()
        kind, value = self.peek()
        if kind == "sym" and value in ("==", "!=", "<", "<=", ">", ">="):
            self.take()
            return ("cmp", value, left, self.operand())
        if (kind, value) == ("name", "in"):
            self.take()
            return ("in", left, self.operand())
        return ("truth", left)

    def operand(self) -> tuple[Any, ...]:
        kind, value = self.take()
        if kind in ("str", "int"):
            return ("lit", value)
        if (kind, value) == ("name", "true") or (kind, value) == ("name", "false"):
            return ("lit", value == "true")
        if (kind, value) == ("sym", "("):
            tree = self.disjunction()
            self.take("sym", ")")
            return ("group", tree)
        if (kind, value) == ("sym", "["):
            return self.list_literal()
        if (kind, value) == ("name", "has"):
            self.take("sym", "(")
            tree = self.device_ref()
            self.take("sym", ")")
            if tree[0] != "attr":
                raise self.fail("has() takes device.attributes[\"<domain>\"].<name>")
            return ("has", tree[1])
        if (kind, value) == ("name", "device"):
            self.index -= 1
            return self.device_ref()
        raise self.fail(f"unsupported {value!r} (only device.driver, device.attributes, literals, "
                        "comparisons, in, has, && || ! are supported)")

    def list_literal(self) -> tuple[Any, ...]:
        items = []
        while self.peek() != ("sym", "]"):
            item = self.operand()
            if item[0] != "lit":
                raise self.fail("list items must be literals")
            items.append(item[1])
            if self.peek() == ("sym", ","):
                self.take()
        self.take("sym", "]")
        return ("lit", tuple(items))

    def device_ref(self) -> tuple[Any, ...]:
        self.take("name", "device")
        self.take("sym", ".")
        _, field = self.take("name")
        if field in ("driver", "allowMultipleAllocations"):
            return ("field", field)
        if field != "attributes":
            raise self.fail(f"device.{field} is not supported (device.driver, device.attributes, "
                            "device.allowMultipleAllocations)")
        self.take("sym", "[")
        _, domain = self.take("str")
        self.take("sym", "]")
        if self.peek() == ("sym", "."):
            self.take()
            _, name = self.take("name")
        elif self.peek() == ("sym", "["):
            self.take()
            _, name = self.take("str")
            self.take("sym", "]")
        else:
            return ("domain", domain)
        return ("attr", f"{domain}/{name}")


Program = tuple[Any, ...]


def compile_selector(expression: str) -> Program:
    """Parse one selector; CelError when it is outside the subset."""
    if not isinstance(expression, str) or not expression.strip():
        raise CelError(str(expression), "empty expression")
    return _Parser(expression).parse()


def _value(tree: tuple[Any, ...], device: Device) -> Any:
    kind = tree[0]
    if kind == "lit":
        return tree[1]
    if kind == "field":
        return device.driver if tree[1] == "driver" else device.multiple
    if kind == "attr":
        return device.attributes.get(tree[1])
    if kind == "group":
        return evaluate(tree[1], device)
    if kind == "has":
        return tree[1] in device.attributes
    if kind == "domain":
        return {k.rsplit("/", 1)[1] for k in device.attributes if k.rsplit("/", 1)[0] == tree[1]}
    return evaluate(tree, device)


_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def _compare(op: str, left: Any, right: Any) -> bool:
    if left is None or right is None:
        return False
    if op in ("==", "!="):
        return (left == right and type(left) is type(right)) == (op == "==")
    if type(left) is not type(right) or isinstance(left, bool):
        return False
    return _ORDER[op](left, right)


def evaluate(program: Program, device: Device) -> bool:
    kind = program[0]
    if kind == "or":
        return evaluate(program[1], device) or evaluate(program[2], device)
    if kind == "and":
        return evaluate(program[1], device) and evaluate(program[2], device)
    if kind == "not":
        return not evaluate(program[1], device)
    if kind == "cmp":
        return _compare(program[1], _value(program[2], device), _value(program[3], device))
    if kind == "in":
        item, within = _value(program[1], device), _value(program[2], device)
        return item is not None and isinstance(within, tuple | set) and item in within
    if kind == "truth":
        return _value(program[1], device) is True
    return bool(_value(program, device))
