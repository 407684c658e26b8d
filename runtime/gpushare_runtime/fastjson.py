"""JSON through the C accelerator alone: ``import json`` pulls in ``re``, ``enum``
and ``functools``, which cost more than the rest of a create together.

Same results as ``json.loads`` / ``json.dumps(separators=(",", ":"))``; falls
back to the ``json`` module where the accelerator is missing.  Errors are
``ValueError`` (``json.JSONDecodeError`` is one).  ``loads`` is
``gpushare_common.ids.json_loads``, which the annotation parsers use too.
"""

from __future__ import annotations

from gpushare_common.ids import json_loads as loads

try:
    import _json
except ImportError:  # pragma: no cover - every CPython build has it
    _json = None  # type: ignore[assignment]


def _not_serializable(value: object) -> object:
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


_ENCODE = (
    _json.make_encoder(None, _not_serializable, _json.encode_basestring_ascii, None, ":", ",",
                       False, False, True)
    if _json else None
)

__all__ = ["dumps", "loads"]


def dumps(value: object) -> str:
    """Compact JSON, ASCII only, keys in their order."""
    if _ENCODE is None:  # pragma: no cover
        import json

        return json.dumps(value, separators=(",", ":"))
    return "".join(_ENCODE(value, 0))  # type: ignore[operator]
