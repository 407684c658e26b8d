"""JSON through the C accelerator alone: ``import json`` pulls in ``re``, ``enum``
and ``functools``, which cost more than the rest of a create together.

Same results as ``json.loads`` / ``json.dumps(separators=(",", ":"))``; falls
back to the ``json`` module where the accelerator is missing.  Errors are
``ValueError`` (``json.JSONDecodeError`` is one).
"""

from __future__ import annotations

try:
    import _json
except ImportError:  # pragma: no cover - every CPython build has it
    _json = None  # type: ignore[assignment]

_WHITESPACE = " \t\n\r"


class _Context:
    """The attributes the C scanner reads from a ``json.JSONDecoder``."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo: dict[str, str] = {}

    @staticmethod
    def parse_constant(name: str) -> float:
        return float(name.replace("Infinity", "inf"))


def _not_serializable(value: object) -> object:
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _scanner() -> object:
    return _json.make_scanner(_Context()) if _json else None  # type: ignore[arg-type]


_SCAN = _scanner()
_ENCODE = (
    _json.make_encoder(None, _not_serializable, _json.encode_basestring_ascii, None, ":", ",",
                       False, False, True)
    if _json else None
)


def loads(text: str | bytes) -> object:
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"not UTF-8: {err}") from None
    if _SCAN is None:  # pragma: no cover
        import json

        return json.loads(text)
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _SCAN(text, start)  # type: ignore[operator]
    except StopIteration as stop:
        raise ValueError(f"expecting a JSON value at character {stop.value}") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if text[end:].strip(_WHITESPACE):
        raise ValueError(f"extra data at character {end}")
    return value


def dumps(value: object) -> str:
    """Compact JSON, ASCII only, keys in their order."""
    if _ENCODE is None:  # pragma: no cover
        import json

        return json.dumps(value, separators=(",", ":"))
    return "".join(_ENCODE(value, 0))  # type: ignore[operator]
