"""Resolve a REST path to the resource it names."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ApiError
from .kinds import BY_PATH, Kind


@dataclass(frozen=True, slots=True)
class Route:
    kind: Kind
    namespace: str | None  # None: every namespace (or a cluster-scoped kind)
    name: str | None = None
    subresource: str | None = None


def _kind(group: str, version: str, plural: str) -> Kind:
    kind = BY_PATH.get((group, version, plural))
    if kind is None:
        where = f"{group}/{version}" if group else version
        raise ApiError(404, f"the server could not find the requested resource {plural!r} in {where}")
    return kind


def resolve(group: str, version: str, parts: list[str]) -> Route:
    """parts: the path segments after /api/v1 or /apis/<group>/<version>."""
    if (
        len(parts) >= 3
        and parts[0] == "namespaces"
        and (kind := BY_PATH.get((group, version, parts[2]))) is not None
        and kind.namespaced
    ):
        return _route(kind, parts[1], parts[3:])
    if not parts:
        raise ApiError(404, "the server could not find the requested resource")
    kind = _kind(group, version, parts[0])
    if kind.namespaced and len(parts) > 1:
        raise ApiError(404, f"{kind.plural} are namespaced: use /namespaces/<namespace>/{kind.plural}")
    return _route(kind, None, parts[1:])


def _route(kind: Kind, namespace: str | None, rest: list[str]) -> Route:
    if namespace == "":
        raise ApiError(404, "empty namespace in the path")
    if len(rest) > 2 or any(not part for part in rest):
        raise ApiError(404, "the server could not find the requested resource")
    name = rest[0] if rest else None
    subresource = rest[1] if len(rest) > 1 else None
    if subresource is not None and subresource not in kind.subresources:
        raise ApiError(404, f"{kind.plural} have no subresource {subresource!r}")
    return Route(kind, namespace, name, subresource)
