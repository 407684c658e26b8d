"""Discovery documents (/api, /apis, group versions, /version)."""

from __future__ import annotations

import re
from typing import Any

from .kinds import KINDS, Kind

_SUB_VERBS = {"status": ["get", "patch", "update"], "binding": ["create"], "eviction": ["create"], "log": ["get"],
              "token": ["create"]}
_SUB_KINDS = {"binding": "Binding", "eviction": "Eviction", "token": "TokenRequest"}
_SUB_GROUPS = {"eviction": ("policy", "v1"), "token": ("authentication.k8s.io", "v1")}
_VERSION = re.compile(r"^v([0-9]+)(?:(alpha|beta)([0-9]+))?$")

VERSION_INFO = {
    "major": "1",
    "minor": "34",
    "gitVersion": "v1.34.0-gpushare-sim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-01-01T00:00:00Z",
    "goVersion": "go1.22.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def _resources(kind: Kind) -> list[dict[str, Any]]:
    main = {
        "name": kind.plural,
        "singularName": kind.kind.lower(),
        "namespaced": kind.namespaced,
        "kind": kind.kind,
        "verbs": list(kind.verbs),
        "shortNames": list(kind.short_names),
        "categories": list(kind.categories),
    }
    subs = []
    for sub in kind.subresources:
        entry: dict[str, Any] = {
            "name": f"{kind.plural}/{sub}",
            "singularName": "",
            "namespaced": kind.namespaced,
            "kind": _SUB_KINDS.get(sub, kind.kind),
            "verbs": _SUB_VERBS[sub],
        }
        if sub in _SUB_GROUPS:
            entry["group"], entry["version"] = _SUB_GROUPS[sub]
        subs.append(entry)
    return [main, *subs]


def resource_list(group: str, version: str) -> dict[str, Any] | None:
    kinds = [k for k in KINDS if k.group == group and k.version == version]
    if not kinds:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": [r for k in kinds for r in _resources(k)],
    }


def core_versions(address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
    }


def _version_priority(version: str) -> tuple[int, int, int, str]:
    """Kubernetes' version order: GA before beta before alpha, then the higher numbers."""
    match = _VERSION.match(version)
    if match is None:
        return (3, 0, 0, version)
    major, stage, minor = match.groups()
    return ({None: 0, "beta": 1, "alpha": 2}[stage], -int(major), -int(minor or 0), version)


def _group(name: str) -> dict[str, Any]:
    versions = sorted({k.version for k in KINDS if k.group == name}, key=_version_priority)
    entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": entries, "preferredVersion": entries[0]}


def group_list() -> dict[str, Any]:
    names = sorted({k.group for k in KINDS if k.group})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(n) for n in names]}


def group(name: str) -> dict[str, Any] | None:
    if not any(k.group == name for k in KINDS):
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name)}


def _gvk(kind: Kind) -> dict[str, str]:
    return {"group": kind.group, "version": kind.version, "kind": kind.kind}


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def openapi_index() -> dict[str, Any]:
    """/openapi/v3: one document per group version."""
    versions = sorted({(k.group, k.version) for k in KINDS})
    return {
        "paths": {
            _gv_path(g, v): {"serverRelativeURL": f"/openapi/v3/{_gv_path(g, v)}"} for g, v in versions
        }
    }


def openapi_document(path: str) -> dict[str, Any] | None:
    """A minimal OpenAPI v3 document for a group version: each object path with the
    GVK of its PATCH operation and the `fieldValidation` parameter, which tells kubectl
    that the server validates fields itself (it then needs no schemas)."""
    kinds = [k for k in KINDS if _gv_path(k.group, k.version) == path]
    if not kinds:
        return None
    parameter = {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}
    paths = {}
    for kind in kinds:
        prefix = f"/{path}/namespaces/{{namespace}}" if kind.namespaced else f"/{path}"
        operation = {"x-kubernetes-group-version-kind": _gvk(kind), "parameters": [parameter]}
        # every kind gets its PATCH: kubectl reads it as "this server validates fields itself"
        paths[f"{prefix}/{kind.plural}/{{name}}"] = {"patch": operation, "put": operation}
        paths[f"{prefix}/{kind.plural}"] = {"post": operation}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": VERSION_INFO["gitVersion"]},
        "paths": paths,
        "components": {"schemas": {}},
    }
