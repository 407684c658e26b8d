"""Label and field selectors: parse the query-string syntax, match objects.

Grammar (as the API server reads it):
  label selector  := requirement ("," requirement)*
  requirement     := key | "!" key | key ("=" | "==" | "!=") value
                   | key ("in" | "notin") "(" value ("," value)* ")"
                   | key (">" | "<") integer
  field selector  := key ("=" | "==" | "!=") value ("," ...)*   (backslash escapes)
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_NAME_RE = re.compile(rf"^{_NAME}$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SPECIAL = set(",()=!<> \t\n")


class SelectorError(ValueError):
    """A selector that does not parse; the message names the offending part."""

    def __init__(self, selector: str, why: str) -> None:
        super().__init__(f"unable to parse selector {selector!r}: {why}")
        self.selector = selector
        self.why = why


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.op
        if op == "exists":
            return self.key in labels
        if op == "!":
            return self.key not in labels
        value = labels.get(self.key)
        if op in ("=", "in"):
            return value is not None and value in self.values
        if op in ("!=", "notin"):
            return value is None or value not in self.values
        if value is None or not _is_int(value):
            return False
        bound = int(self.values[0])
        return int(value) > bound if op == "gt" else int(value) < bound

    def render(self) -> str:
        if self.op == "exists":
            return self.key
        if self.op == "!":
            return f"!{self.key}"
        if self.op in ("in", "notin"):
            return f"{self.key} {self.op} ({','.join(self.values)})"
        symbol = {"gt": ">", "lt": "<"}.get(self.op, self.op)
        return f"{self.key}{symbol}{self.values[0]}"


def _is_int(text: str) -> bool:
    return re.fullmatch(r"-?[0-9]+", text) is not None


def valid_label_key(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.match(prefix)):
        return False
    return 0 < len(name) <= 63 and _NAME_RE.match(name) is not None


def valid_label_value(value: str) -> bool:
    return value == "" or (len(value) <= 63 and _NAME_RE.match(value) is not None)


def _tokens(text: str) -> Iterator[str]:
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in " \t\n":
            i += 1
        elif text.startswith(("==", "!="), i):
            yield text[i : i + 2]
            i += 2
        elif ch in _SPECIAL:
            yield ch
            i += 1
        else:
            j = i
            while j < len(text) and text[j] not in _SPECIAL:
                j += 1
            yield text[i:j]
            i = j


class _LabelParser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = list(_tokens(text))
        self.pos = 0

    def fail(self, why: str) -> SelectorError:
        return SelectorError(self.text, why)

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise self.fail("unexpected end of selector")
        self.pos += 1
        return token

    def key(self) -> str:
        token = self.take()
        if not valid_label_key(token):
            raise self.fail(f"invalid label key {token!r}")
        return token

    def value(self) -> str:
        token = self.peek()
        if token is None or token in _SPECIAL or token in ("==", "!="):
            return ""
        self.pos += 1
        if not valid_label_value(token):
            raise self.fail(f"invalid label value {token!r}")
        return token

    def value_set(self) -> tuple[str, ...]:
        if self.take() != "(":
            raise self.fail("expected '(' after in/notin")
        values = [self.value()]
        while (token := self.take()) == ",":
            values.append(self.value())
        if token != ")":
            raise self.fail(f"expected ')' or ',' but found {token!r}")
        return tuple(sorted(set(values)))

    def requirement(self) -> Requirement:
        if self.peek() == "!":
            self.pos += 1
            return Requirement(self.key(), "!")
        key = self.key()
        op = self.peek()
        if op is None or op == ",":
            return Requirement(key, "exists")
        self.pos += 1
        if op in ("=", "==", "!="):
            return Requirement(key, "!=" if op == "!=" else "=", (self.value(),))
        if op in ("in", "notin"):
            return Requirement(key, op, self.value_set())
        if op in (">", "<"):
            bound = self.take()
            if not _is_int(bound):
                raise self.fail(f"{op} needs an integer, not {bound!r}")
            return Requirement(key, "gt" if op == ">" else "lt", (str(int(bound)),))
        raise self.fail(f"unexpected {op!r} after key {key!r}")

    def parse(self) -> tuple[Requirement, ...]:
        if not self.tokens:
            return ()
        found = [self.requirement()]
        while (token := self.peek()) is not None:
            if token != ",":
                raise self.fail(f"expected ',' but found {token!r}")
            self.pos += 1
            found.append(self.requirement())
        return tuple(found)


def parse_label_selector(text: str) -> tuple[Requirement, ...]:
    """Parse a label selector; raise SelectorError on anything malformed."""
    return _LabelParser(text).parse()


def labels_match(requirements: tuple[Requirement, ...], labels: Mapping[str, str]) -> bool:
    return all(req.matches(labels) for req in requirements)


@dataclass(frozen=True, slots=True)
class FieldTerm:
    field: str
    value: str
    negate: bool = False

    def render(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")
        return f"{self.field}{'!=' if self.negate else '='}{escaped}"


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, current, i = [], [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            current.append(text[i : i + 2])
            i += 2
            continue
        if ch == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current))
    return parts


def _unescape(text: str, selector: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\":
            if i + 1 >= len(text) or text[i + 1] not in "\\,=":
                raise SelectorError(selector, f"invalid escape in {text!r}")
            out.append(text[i + 1])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _field_term(part: str, selector: str) -> FieldTerm:
    for symbol, negate in (("!=", True), ("==", False), ("=", False)):
        index = _find_unescaped(part, symbol)
        if index >= 0:
            field = part[:index].strip()
            if not field:
                raise SelectorError(selector, f"missing field name in {part!r}")
            return FieldTerm(field, _unescape(part[index + len(symbol) :], selector), negate)
    raise SelectorError(selector, f"{part!r} is not field=value or field!=value")


def _find_unescaped(text: str, symbol: str) -> int:
    i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text.startswith(symbol, i):
            return i
        i += 1
    return -1


def parse_field_selector(text: str) -> tuple[FieldTerm, ...]:
    """Parse a field selector; raise SelectorError on anything malformed."""
    if not text.strip():
        return ()
    return tuple(_field_term(part, text) for part in _split_unescaped(text, ","))
