"""Structural checks of request bodies against the Kubernetes OpenAPI models.

The field names and types come from the official client's generated models
(`openapi_types` / `attribute_map`), so the emulator accepts exactly the JSON
shapes the client produces and rejects unknown fields and wrong types.
"""

from __future__ import annotations

import re
from datetime import datetime
from functools import cache
from typing import Any

from kubernetes.client import models

_LIST = re.compile(r"^List\[(.+)\]$")
_DICT = re.compile(r"^Dict\[str, (.+)\]$")
_QUANTITY_MAPS = frozenset({"limits", "requests", "capacity", "allocatable", "overhead", "hard", "used"})


class SchemaError(ValueError):
    """Wrong JSON type at a field path."""

    def __init__(self, path: str, expected: str, got: Any) -> None:
        super().__init__(
            f"cannot decode {type(got).__name__} {got!r:.40} into field {path} of type {expected}"
        )
        self.path = path


@cache
def _fields(model: str) -> dict[str, str]:
    cls = getattr(models, model)
    names: dict[str, str] = cls.attribute_map
    types: dict[str, str] = cls.openapi_types
    return {names[attr]: types[attr] for attr in names}


def check(model: str, value: Any, *, prune: bool = False) -> list[str]:
    """Return the paths of unknown fields (removed when `prune`); raise SchemaError on a
    wrong type."""
    unknown: list[_Unknown] = []
    _check(model, value, "", unknown)
    if prune:
        for found in unknown:
            del found.parent[found.key]
    return [found.path for found in unknown]


class _Unknown:
    __slots__ = ("key", "parent", "path")

    def __init__(self, parent: dict[str, Any], key: str, path: str) -> None:
        self.parent, self.key, self.path = parent, key, path


def _check(kind: str, value: Any, path: str, unknown: list[_Unknown]) -> None:
    if value is None or kind == "object":
        return
    if match := _LIST.match(kind):
        if not isinstance(value, list):
            raise SchemaError(path, kind, value)
        for index, item in enumerate(value):
            _check(match.group(1), item, f"{path}[{index}]", unknown)
    elif match := _DICT.match(kind):
        _check_dict(match.group(1), value, path, unknown)
    elif kind == "str":
        if not isinstance(value, str):
            raise SchemaError(path, kind, value)
    elif kind == "datetime":
        if not isinstance(value, str) or not _is_time(value):
            raise SchemaError(path, "RFC 3339 time", value)
    elif kind in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SchemaError(path, kind, value)
    elif kind == "bool":
        if not isinstance(value, bool):
            raise SchemaError(path, kind, value)
    else:
        _check_model(kind, value, path, unknown)


def _is_time(text: str) -> bool:
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


def _check_dict(kind: str, value: Any, path: str, unknown: list[_Unknown]) -> None:
    if not isinstance(value, dict):
        raise SchemaError(path, f"Dict[str, {kind}]", value)
    quantities = kind == "str" and path.rpartition(".")[2] in _QUANTITY_MAPS
    for key, item in value.items():
        if quantities and isinstance(item, int | float) and not isinstance(item, bool):
            continue  # resource quantities may be written as numbers
        _check(kind, item, f"{path}[{key}]", unknown)


def _check_model(model: str, value: Any, path: str, unknown: list[_Unknown]) -> None:
    if not isinstance(value, dict):
        raise SchemaError(path, model, value)
    fields = _fields(model)
    for key, item in value.items():
        field_type = fields.get(key)
        if field_type is None:
            unknown.append(_Unknown(value, key, _join(path, key)))
        else:
            _check(field_type, item, _join(path, key), unknown)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
