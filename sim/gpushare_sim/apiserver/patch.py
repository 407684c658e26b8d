"""Patch formats: JSON merge patch (RFC 7386), strategic merge patch, JSON patch (RFC 6902).

Every function takes the current object (a plain dict, never modified) and
returns the patched copy; a patch that cannot apply raises PatchError.
"""

from __future__ import annotations

import copy
from typing import Any

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

# Lists that strategic merge patch merges element by element, keyed by this field.
MERGE_KEYS: dict[str, str] = {
    "conditions": "type",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "podIPs": "ip",
    "hostIPs": "ip",
    "readinessGates": "conditionType",
    "resourceClaims": "name",
    "topologySpreadConstraints": "topologyKey",
    "addresses": "type",
    "taints": "key",
}
# Lists of scalars that strategic merge patch unions instead of replacing.
MERGE_SETS = frozenset({"finalizers"})


class PatchError(ValueError):
    """A patch that is malformed (`code` 400) or does not apply (`code` 422)."""

    def __init__(self, message: str, code: int = 422) -> None:
        super().__init__(message)
        self.code = code


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Merge patch that merges known lists by key and honours `$patch` directives."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    if directive not in (None, "merge"):
        raise PatchError(f"unknown $patch directive {directive!r}", 400)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        _strategic_field(result, key, value)
    return result


def _strategic_field(result: dict[str, Any], key: str, value: Any) -> None:
    if key.startswith("$setElementOrder/") or key in ("$patch", "$retainKeys"):
        return
    if key.startswith("$deleteFromPrimitiveList/"):
        field = key.partition("/")[2]
        drop = set(map(str, value or []))
        if isinstance(result.get(field), list):
            result[field] = [v for v in result[field] if str(v) not in drop]
        return
    if value is None:
        result.pop(key, None)
    elif isinstance(value, list) and isinstance(result.get(key), list):
        result[key] = _merge_list(key, result[key], value)
    else:
        merged = strategic_merge_patch(result.get(key), value)
        if merged is None:
            result.pop(key, None)
        else:
            result[key] = merged


def _merge_list(field: str, current: list[Any], patch: list[Any]) -> list[Any]:
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, dict) and "$patch" in i)]
    if field in MERGE_SETS:
        return list(current) + [v for v in patch if v not in current]
    key = MERGE_KEYS.get(field)
    if key is None or not all(isinstance(item, dict) for item in patch):
        return copy.deepcopy(patch)
    merged = list(current)
    for item in patch:
        _merge_item(merged, key, item, field)
    return merged


def _merge_item(merged: list[Any], key: str, item: dict[str, Any], field: str) -> None:
    if key not in item:
        raise PatchError(f"{field}: element without merge key {key!r}", 422)
    index = next(
        (i for i, old in enumerate(merged) if isinstance(old, dict) and old.get(key) == item[key]),
        -1,
    )
    if item.get("$patch") == "delete":
        if index >= 0:
            del merged[index]
        return
    if index >= 0:
        merged[index] = strategic_merge_patch(merged[index], item)
    else:
        merged.append(strategic_merge_patch({}, item))


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 with add, remove, replace, move, copy and test."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations", 400)
    document = copy.deepcopy(target)
    for number, operation in enumerate(operations):
        if not isinstance(operation, dict) or not isinstance(operation.get("path"), str):
            raise PatchError(f"operation {number}: needs an object with a string path", 400)
        document = _apply_operation(document, operation)
    return document


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with '/'", 400)
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(document: Any, parts: list[str], path: str) -> Any:
    node = document
    for part in parts[:-1]:
        node = _child(node, part, path)
    return node


def _child(node: Any, part: str, path: str) -> Any:
    if isinstance(node, dict) and part in node:
        return node[part]
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    raise PatchError(f"path {path!r} does not exist")


def _get(document: Any, path: str) -> Any:
    node = document
    for part in _pointer(path):
        node = _child(node, part, path)
    return node


def _remove(document: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent = _parent(document, parts, path)
    value = _child(parent, parts[-1], path)
    if isinstance(parent, list):
        del parent[int(parts[-1])]
    else:
        del parent[parts[-1]]
    return value


def _add(document: Any, path: str, value: Any, replace: bool) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _parent(document, parts, path)
    last = parts[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise PatchError(f"path {path!r} does not exist")
        parent[last] = value
    elif isinstance(parent, list):
        _list_add(parent, last, value, replace, path)
    else:
        raise PatchError(f"path {path!r} does not name a field of an object or list")
    return document


def _list_add(parent: list[Any], last: str, value: Any, replace: bool, path: str) -> None:
    if last == "-" and not replace:
        parent.append(value)
        return
    if not last.isdigit() or int(last) > len(parent) - (1 if replace else 0):
        raise PatchError(f"index in {path!r} is out of range")
    if replace:
        parent[int(last)] = value
    else:
        parent.insert(int(last), value)


def _apply_operation(document: Any, operation: dict[str, Any]) -> Any:
    op, path = operation.get("op"), operation["path"]
    if op in ("add", "replace", "test") and "value" not in operation:
        raise PatchError(f"{op} at {path!r} needs a value", 400)
    if op in ("move", "copy") and not isinstance(operation.get("from"), str):
        raise PatchError(f"{op} at {path!r} needs a string 'from'", 400)
    if op == "add":
        return _add(document, path, copy.deepcopy(operation["value"]), replace=False)
    if op == "replace":
        return _add(document, path, copy.deepcopy(operation["value"]), replace=True)
    if op == "remove":
        _remove(document, path)
        return document
    if op == "move":
        return _add(document, path, _remove(document, operation["from"]), replace=False)
    if op == "copy":
        value = copy.deepcopy(_get(document, operation["from"]))
        return _add(document, path, value, replace=False)
    if op == "test":
        if _get(document, path) != operation["value"]:
            raise PatchError(f"test at {path!r} failed")
        return document
    raise PatchError(f"unknown JSON patch operation {op!r}", 400)


def apply_patch(content_type: str, target: dict[str, Any], patch: Any) -> Any:
    """Dispatch on the request's Content-Type (parameters such as charset ignored)."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == JSON_PATCH:
        return json_patch(target, patch)
    if kind == MERGE_PATCH:
        return merge_patch(target, patch)
    if kind == STRATEGIC_PATCH:
        return strategic_merge_patch(target, patch)
    raise PatchError(f"unsupported patch type {kind!r}", 415)
