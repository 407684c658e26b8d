"""Just enough YAML for CDI spec files, with the standard library only.

Block mappings and sequences (``key: value``, ``- item``, ``- key: value``),
plain, single- and double-quoted scalars, flow lists and maps of scalars
(``[a, "b"]``, ``{}``), comments and a leading ``---``.  Anchors, aliases, tags,
multi-line scalars, directives and multiple documents are rejected with
:class:`YamlError` naming the line.  Scalars stay strings except integers
(decimal, ``0o17``/``017`` octal as YAML 1.1 reads file modes, ``0x1f``),
``true``/``false`` and ``null``/``~``.  No ``re`` and no ``json`` import: a spot
create reads NVIDIA's YAML CDI spec on the create path.
"""

from __future__ import annotations

from gpushare_common.ids import json_loads

_DIGITS = frozenset("0123456789")
_OCTAL = frozenset("01234567")
_HEX = frozenset("0123456789abcdefABCDEF")
_SPACE = " \t"


def _integer(text: str) -> int | None:
    """The value of a YAML integer scalar, None when ``text`` is not one."""
    body = text[1:] if text[:1] in "+-" else text
    sign = -1 if text[:1] == "-" else 1
    if body[:2] in ("0o", "0x") and len(body) > 2:
        digits, base = body[2:], (8 if body[1] == "o" else 16)
        return sign * int(digits, base) if set(digits) <= (_OCTAL if base == 8 else _HEX) else None
    if len(body) > 1 and body[0] == "0":
        return sign * int(body, 8) if set(body) <= _OCTAL else None
    return sign * int(body) if body and set(body) <= _DIGITS else None


def _quoted_end(text: str) -> int | None:
    """The index after the quoted scalar that starts ``text``; None if it is not closed."""
    quote, index = text[0], 1
    while index < len(text):
        char = text[index]
        if quote == '"' and char == "\\":
            index += 2
            continue
        if char == quote:
            if quote == "'" and text[index + 1 : index + 2] == "'":
                index += 2
                continue
            return index + 1
        index += 1
    return None


def _key(text: str) -> tuple[str, int] | None:
    """``(key token, index after its ':')`` of a ``key: value`` line, None for anything else."""
    if text[:1] in ('"', "'"):
        end = _quoted_end(text)
        if end is None:
            return None
        colon = end + len(text[end:]) - len(text[end:].lstrip(_SPACE))
    elif text[:1] and text[0] not in "'\"#:" + _SPACE:
        colon = text.find(":")
        if colon < 0 or "#" in text[:colon]:
            return None
        end = len(text[:colon].rstrip(_SPACE))
    else:
        return None
    if text[colon : colon + 1] != ":" or text[colon + 1 : colon + 2] not in ("", " ", "\t"):
        return None
    return text[:end], colon + 1


class YamlError(ValueError):
    def __init__(self, line: int, reason: str) -> None:
        self.line = line
        self.reason = reason
        super().__init__(f"line {line}: {reason}")


class _Line:
    __slots__ = ("indent", "number", "text")

    def __init__(self, number: int, indent: int, text: str) -> None:
        self.number = number
        self.indent = indent
        self.text = text


def _strip_comment(text: str) -> str:
    quote = ""
    for index, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "#" and (index == 0 or text[index - 1] in " \t"):
            return text[:index].rstrip()
    return text.rstrip()


def _lines(text: str) -> list[_Line]:
    found: list[_Line] = []
    for number, raw in enumerate(text.splitlines(), 1):
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise YamlError(number, "tabs are not allowed for indentation")
        body = _strip_comment(raw)
        if not body.strip() or (not found and body.strip() == "---"):
            continue
        if body.strip() in ("---", "...") or body.lstrip()[:1] in ("&", "*", "!", "|", ">", "%"):
            raise YamlError(number, f"unsupported YAML: {body.strip()[:40]!r}")
        found.append(_Line(number, len(body) - len(body.lstrip()), body.strip()))
    return found


def _scalar(text: str, line: int) -> object:
    if text.startswith('"'):
        try:
            value = json_loads(text)
        except ValueError:
            raise YamlError(line, f"bad double-quoted scalar {text[:40]!r}") from None
        if not isinstance(value, str):
            raise YamlError(line, f"bad double-quoted scalar {text[:40]!r}")
        return value
    if text.startswith("'"):
        if len(text) < 2 or not text.endswith("'") or "'" in text[1:-1].replace("''", ""):
            raise YamlError(line, f"bad single-quoted scalar {text[:40]!r}")
        return text[1:-1].replace("''", "'")
    if text.startswith(("[", "{")):
        return _flow(text, line)
    if text[:1] in ("&", "*", "!", "|", ">", "%", "@", "`"):
        raise YamlError(line, f"unsupported YAML: {text[:40]!r}")
    if text in ("null", "~", "Null", "NULL"):
        return None
    if text in ("true", "True", "TRUE", "false", "False", "FALSE"):
        return text.lower() == "true"
    number = _integer(text)
    return text if number is None else number


def _flow(text: str, line: int) -> object:
    closing = "]" if text[0] == "[" else "}"
    if not text.endswith(closing):
        raise YamlError(line, f"unterminated flow collection {text[:40]!r}")
    inner = text[1:-1].strip()
    if closing == "}":
        if inner:
            raise YamlError(line, "only empty flow mappings {} are supported")
        return {}
    if not inner:
        return []
    items = [item.strip() for item in inner.split(",")]
    if any(not item or item[0] in "[{" for item in items):
        raise YamlError(line, f"unsupported flow sequence {text[:40]!r}")
    return [_scalar(item, line) for item in items]


class _Parser:
    def __init__(self, lines: list[_Line]) -> None:
        self.lines = lines
        self.index = 0

    def peek(self) -> _Line | None:
        return self.lines[self.index] if self.index < len(self.lines) else None

    def block(self, indent: int) -> object:
        line = self.peek()
        if line is None or line.indent < indent:
            return None
        if line.text == "-" or line.text.startswith("- "):
            return self.sequence(line.indent)
        return self.mapping(line.indent)

    def sequence(self, indent: int) -> list[object]:
        items: list[object] = []
        while (line := self.peek()) and line.indent == indent and line.text[:2] in ("- ", "-"):
            rest = line.text[1:].lstrip()
            if not rest:
                self.index += 1
                items.append(self.block(indent + 1))
                continue
            offset = line.indent + len(line.text) - len(rest)
            self.lines[self.index] = _Line(line.number, offset, rest)
            items.append(self.value_at(offset))
        return items

    def value_at(self, indent: int) -> object:
        line = self.lines[self.index]
        if _key(line.text) or line.text.startswith("- "):
            return self.block(indent)
        self.index += 1
        return _scalar(line.text, line.number)

    def mapping(self, indent: int) -> dict[str, object]:
        result: dict[str, object] = {}
        while (line := self.peek()) and line.indent == indent:
            match = _key(line.text)
            if not match:
                raise YamlError(line.number, f"expected 'key: value', got {line.text[:40]!r}")
            key = _scalar(match[0], line.number)
            if not isinstance(key, str) or key in result:
                raise YamlError(line.number, f"bad or duplicate key {match[0]!r}")
            rest = line.text[match[1] :].strip()
            self.index += 1
            result[key] = _scalar(rest, line.number) if rest else self.nested(indent)
        return result

    def nested(self, indent: int) -> object:
        line = self.peek()
        if line is None:
            return None
        if line.indent > indent:
            return self.block(line.indent)
        if line.indent == indent and line.text[:2] in ("- ", "-"):
            return self.sequence(indent)
        return None


def loads(text: str) -> object:
    """Parse one YAML document of the supported subset."""
    lines = _lines(text)
    if not lines:
        return None
    parser = _Parser(lines)
    if len(lines) == 1 and not _key(lines[0].text) and lines[0].text[:2] not in ("- ", "-"):
        return _scalar(lines[0].text, lines[0].number)
    value = parser.block(lines[0].indent)
    if parser.index < len(lines):
        line = lines[parser.index]
        raise YamlError(line.number, f"unexpected indentation at {line.text[:40]!r}")
    return value
