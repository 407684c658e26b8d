"""What one REST resource is: where it lives and the rules that differ between resources."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

Obj = dict[str, Any]

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
META_FIELDS = frozenset({"metadata.name", "metadata.namespace"})
ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


def _no_defaults(obj: Obj) -> None:
    return None


@dataclass(frozen=True)
class Kind:
    """One REST resource: where it lives and how it behaves."""

    plural: str
    kind: str
    model: str  # name of the official client's model, used for schema checks
    group: str = ""
    version: str = "v1"
    namespaced: bool = True
    status_subresource: bool = False
    graceful_delete: bool = False
    field_labels: frozenset[str] = META_FIELDS
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()  # `kubectl get all` lists the kinds in category "all"
    subresources: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ALL_VERBS
    stored: bool = True  # False: a review kind, answered and never kept (TokenReview)
    delete_returns_object: bool = False  # DELETE answers with the object, not a Status (as the API's docs say)
    on_create: Callable[[Obj], None] = field(default=_no_defaults)
    on_update: Callable[[Obj, Obj], None] = field(default=lambda old, new: None)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def resource(self) -> str:
        """`plural.group` as error messages name it (`pods`, `resourceslices.resource.k8s.io`)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def field_value(self, obj: Obj, label: str) -> str:
        """The value a field selector compares with ("" when the field is absent)."""
        node: Any = obj
        for part in _path(label):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, bool):
            return "true" if node else "false"
        return "" if node is None else str(node)


@cache
def _path(label: str) -> tuple[str, ...]:
    return tuple(("source.component" if label == "source" else label).split("."))


def valid_name(name: str) -> bool:
    return 0 < len(name) <= 253 and _DNS_SUBDOMAIN.match(name) is not None
