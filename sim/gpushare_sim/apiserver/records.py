"""Stored objects, recorded changes and selections (which objects a list or watch wants)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from .kinds import Kind
from .selectors import FieldTerm, Requirement, labels_match

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped kinds

INDEXED_FIELD = "spec.nodeName"  # node agents each list and watch their own node's pods

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def encode(obj: Any) -> bytes:
    return _encode(obj)


@dataclass(slots=True)
class Entry:
    """A stored object and its encoded JSON (objects are never mutated once stored)."""

    obj: Obj
    raw: bytes

    def copy(self) -> Obj:
        result: Obj = _decode(self.raw)
        return result

    @property
    def rv(self) -> int:
        return int(self.obj["metadata"]["resourceVersion"])


@dataclass(slots=True)
class Change:
    rv: int
    kind: Kind
    type: str  # ADDED, MODIFIED, DELETED
    entry: Entry
    old: Entry | None
    lines: dict[str, bytes] = field(default_factory=dict)

    def line(self, event_type: str) -> bytes:
        cached = self.lines.get(event_type)
        if cached is None:
            source = self.entry
            if event_type == "DELETED" and self.type == "MODIFIED" and self.old is not None:
                obj = self.old.copy()  # left the selection: the last state that matched
                obj["metadata"]["resourceVersion"] = str(self.rv)
                source = Entry(obj, _encode(obj))
            cached = event_line(event_type, source.raw)
            self.lines[event_type] = cached
        return cached


def node_of(obj: Obj) -> str:
    spec = obj.get("spec")
    return str(spec.get("nodeName") or "") if isinstance(spec, dict) else ""


def event_line(event_type: str, raw: bytes) -> bytes:
    return b'{"type":"' + event_type.encode() + b'","object":' + raw + b"}\n"


@dataclass(frozen=True, slots=True)
class Selection:
    """Which objects of a kind a list or watch asks for."""

    kind: Kind
    namespace: str | None = None
    labels: tuple[Requirement, ...] = ()
    fields: tuple[FieldTerm, ...] = ()

    def index_key(self) -> str | None:
        """The node this selection is limited to, if any (lists and watchers use an index)."""
        for term in self.fields:
            if term.field == INDEXED_FIELD and not term.negate and term.value:
                return term.value
        return None

    def matches(self, obj: Obj) -> bool:
        meta = obj["metadata"]
        if self.namespace is not None and meta.get("namespace", "") != self.namespace:
            return False
        if self.labels and not labels_match(self.labels, meta.get("labels") or {}):
            return False
        field_value = self.kind.field_value
        return all((field_value(obj, term.field) == term.value) != term.negate for term in self.fields)
