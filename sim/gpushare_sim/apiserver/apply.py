"""Server-side apply (`PATCH` with `application/apply-patch+yaml`, `kubectl apply --server-side`).

Each field manager owns the fields it applied, recorded in `metadata.managedFields`
(operation Apply, FieldsV1 as the API server writes it: `f:<field>`,
`k:{"<merge key>":...}` for items of keyed lists, `.` for the item itself). Applying
a configuration creates the object when it is missing; otherwise it removes the
fields this manager applied before and no longer does (unless another manager owns
them), refuses (409) to change a field another applier owns to another value unless
`force=true` (which takes the field over), and merges the configuration in (keyed
lists by key, as a strategic merge patch does). Conflicts are only found against
other appliers: fields written by update or patch are not tracked.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from . import errors
from .objects import now_rfc3339
from .patch import MERGE_KEYS, strategic_merge_patch

Path = tuple[str, ...]
_IDENTITY = {("f:apiVersion",), ("f:kind",), ("f:metadata", "f:name"), ("f:metadata", "f:namespace")}
_SKIPPED_META = ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields", "selfLink")


def field_set(config: Any) -> set[Path]:
    """The leaf fields a configuration sets."""
    return {p for p in _paths(config) if p not in _IDENTITY and not _server_owned(p)}


def _server_owned(path: Path) -> bool:
    return len(path) >= 2 and path[0] == "f:metadata" and path[1][2:] in _SKIPPED_META


def _paths(value: Any, key: str = "") -> set[Path]:
    if isinstance(value, dict):
        found: set[Path] = set()
        for name, item in value.items():
            inner = _paths(item, name)
            found |= {(f"f:{name}", *p) for p in inner} if inner else {(f"f:{name}",)}
        return found
    merge_key = MERGE_KEYS.get(key)
    if isinstance(value, list) and merge_key and all(isinstance(i, dict) and merge_key in i for i in value):
        keyed: set[Path] = set()
        for item in value:
            segment = "k:" + json.dumps({merge_key: item[merge_key]}, separators=(",", ":"))
            keyed |= {(segment, ".")} | {(segment, *p) for p in _paths(item)}
        return keyed
    return set()  # a scalar, an empty map or an atomic list: a leaf


def encode(paths: Iterable[Path]) -> dict[str, Any]:
    """FieldsV1: the paths as nested objects."""
    root: dict[str, Any] = {}
    for path in sorted(paths):
        node = root
        for segment in path:
            node = node.setdefault(segment, {})
    return root


def decode(fields: Any) -> set[Path]:
    if not isinstance(fields, dict):
        return set()
    found: set[Path] = set()
    for segment, inner in fields.items():
        below = decode(inner)
        found |= {(segment, *p) for p in below} if below else {(segment,)}
    return found


def _child(node: Any, segment: str) -> Any:
    if segment.startswith("f:") and isinstance(node, dict):
        return node.get(segment[2:])
    if segment.startswith("k:") and isinstance(node, list):
        wanted = json.loads(segment[2:])
        return next((i for i in node if isinstance(i, dict) and all(i.get(k) == v for k, v in wanted.items())), None)
    return None


def value_at(obj: Any, path: Path) -> Any:
    node = obj
    for segment in path:
        if segment == ".":
            return node
        node = _child(node, segment)
    return node


def remove(obj: Any, path: Path) -> None:
    """Remove the field (or, for `k:...` then `.`, the list item) at `path`, if there."""
    if path[-1] == ".":
        parent, item = value_at(obj, path[:-2]), value_at(obj, path[:-1])
        if isinstance(parent, list) and item is not None:
            parent.remove(item)
        return
    parent = value_at(obj, path[:-1])
    if isinstance(parent, dict) and path[-1].startswith("f:"):
        parent.pop(path[-1][2:], None)


def _entries(live: dict[str, Any]) -> list[dict[str, Any]]:
    entries = (live.get("metadata") or {}).get("managedFields") or []
    return [e for e in entries if isinstance(e, dict)]


def _conflicts(live: dict[str, Any], config: dict[str, Any], manager: str, wanted: set[Path]) -> dict[str, set[Path]]:
    found: dict[str, set[Path]] = {}
    for entry in _entries(live):
        if entry.get("manager") == manager or entry.get("operation") != "Apply":
            continue
        for path in decode(entry.get("fieldsV1")) & wanted:
            if path[-1] != "." and value_at(live, path) != value_at(config, path):
                found.setdefault(str(entry.get("manager")), set()).add(path)
    return found


def _render(path: Path) -> str:
    return "".join(f".{s[2:]}" if s.startswith("f:") else f"[{s[2:]}]" for s in path if s != ".")


def entry(manager: str, api_version: str, paths: set[Path], subresource: str = "") -> dict[str, Any]:
    body = {"manager": manager, "operation": "Apply", "apiVersion": api_version, "time": now_rfc3339(),
            "fieldsType": "FieldsV1", "fieldsV1": encode(paths)}  # fmt: skip
    if subresource:
        body["subresource"] = subresource
    return body


def _refuse(conflicts: dict[str, set[Path]]) -> errors.ApiError:
    lines = [f'conflict with "{who}": {_render(p)}' for who, paths in sorted(conflicts.items()) for p in sorted(paths)]
    plural = "s" if len(lines) > 1 else ""
    return errors.ApiError(409, f"Apply failed with {len(lines)} conflict{plural}: {'; '.join(lines)}",
                           reason="Conflict")  # fmt: skip


def _without_server_meta(config: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in (config.get("metadata") or {}).items() if k not in _SKIPPED_META}
    return {**config, "metadata": meta}


def _handed_over(entries: list[dict[str, Any]], mine: Any, taken: set[Path]) -> list[dict[str, Any]]:
    """The other managers' entries, less the fields `force` took from their appliers."""
    kept = []
    for other in entries:
        if other is mine:
            continue
        if taken and other.get("operation") == "Apply":
            other = {**other, "fieldsV1": encode(decode(other.get("fieldsV1")) - taken)}
        kept.append(other)
    return kept


def apply(live: dict[str, Any], config: dict[str, Any], manager: str, force: bool, subresource: str = "") -> Any:
    """The object after `manager` applies `config` to `live` (neither is modified)."""
    wanted = field_set(config)
    conflicts = _conflicts(live, config, manager, wanted)
    if conflicts and not force:
        raise _refuse(conflicts)
    entries = _entries(live)
    mine = next((e for e in entries if e.get("manager") == manager and e.get("operation") == "Apply"), None)
    others: set[Path] = set().union(*(decode(e.get("fieldsV1")) for e in entries if e is not mine))
    result = json.loads(json.dumps(live))
    dropped = (decode(mine.get("fieldsV1")) if mine else set()) - wanted - others
    # whole list items first (found by their key, which removing their fields would lose), then deepest first
    for path in sorted(dropped, key=lambda p: (p[-1] != ".", -len(p))):
        remove(result, path)
    result = strategic_merge_patch(result, _without_server_meta(config))
    taken: set[Path] = set().union(*conflicts.values()) if conflicts else set()
    api_version = str(config.get("apiVersion") or live.get("apiVersion") or "")
    result.setdefault("metadata", {})["managedFields"] = [
        *_handed_over(entries, mine, taken), entry(manager, api_version, wanted, subresource)]
    return result
