"""Server-side tables (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), what
`kubectl get` asks for: lists, single objects and watch events as meta.k8s.io
Tables whose rows carry the kind's cells and the object (`includeObject`:
None, Metadata (the default) or Object)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from .errors import bad_request
from .kind import Kind, Obj
from .printers import DEFAULT, RESOURCE, Printer
from .printers_core import CORE

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
_PRINTERS: dict[str, Printer] = {**CORE, **RESOURCE}
_INCLUDE = ("None", "Metadata", "Object")
_COMPLETED = {
    "Succeeded": {"type": "Completed", "status": "True", "reason": "Succeeded",
                  "message": "The pod has completed successfully."},
    "Failed": {"type": "Completed", "status": "True", "reason": "Failed", "message": "The pod failed."},
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class TableRequest:
    version: str  # meta.k8s.io version: v1 or v1beta1
    include: str  # None, Metadata or Object

    @property
    def media_type(self) -> str:
        return f"application/json;as=Table;v={self.version};g=meta.k8s.io"


def negotiate(accept: str | None, query: Mapping[str, str]) -> TableRequest | None:
    """The first Table media type the client accepts, or None (plain JSON)."""
    for option in (accept or "").split(","):
        media, *params = (part.strip() for part in option.split(";"))
        pairs = dict(p.split("=", 1) for p in params if "=" in p)
        if media in ("application/json", "*/*") and not pairs:
            return None
        table = media == "application/json" and pairs.get("as") == "Table" and pairs.get("g") == "meta.k8s.io"
        if table and pairs.get("v") in ("v1", "v1beta1"):
            return TableRequest(pairs["v"], _include(query))
    return None


def _include(query: Mapping[str, str]) -> str:
    value = query.get("includeObject") or "Metadata"
    if value not in _INCLUDE:
        raise bad_request(f"includeObject must be one of {', '.join(_INCLUDE)}, not {value!r}")
    return value


def table(kind: Kind, objects: list[Obj], meta: dict[str, Any], request: TableRequest) -> bytes:
    printer = _PRINTERS.get(kind.plural, DEFAULT)
    now = time.time()
    rows = [_row(kind, printer, obj, now, request) for obj in objects]
    body = {
        "kind": "Table",
        "apiVersion": f"meta.k8s.io/{request.version}",
        "metadata": meta,
        "columnDefinitions": [column.definition() for column in printer.columns],
        "rows": rows,
    }
    return _encode(body)


def _row(kind: Kind, printer: Printer, obj: Obj, now: float, request: TableRequest) -> dict[str, Any]:
    row: dict[str, Any] = {"cells": printer.cells(obj, now)}
    if kind.plural == "pods":
        condition = _COMPLETED.get((obj.get("status") or {}).get("phase", ""))
        if condition is not None:
            row["conditions"] = [condition]
    if request.include == "Object":
        row["object"] = obj
    elif request.include == "Metadata":
        row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": f"meta.k8s.io/{request.version}",
                         "metadata": obj.get("metadata") or {}}  # fmt: skip
    return row


async def watch_tables(kind: Kind, lines: AsyncIterator[bytes], request: TableRequest) -> AsyncIterator[bytes]:
    """A watch stream with each event's object turned into a one-row Table."""
    async for chunk in lines:
        out = []
        for line in chunk.splitlines():
            event = _decode(line)
            obj = event.get("object")
            if event.get("type") in ("ADDED", "MODIFIED", "DELETED") and isinstance(obj, dict):
                version = (obj.get("metadata") or {}).get("resourceVersion", "")
                event["object"] = msgspec.Raw(table(kind, [obj], {"resourceVersion": version}, request))
            out.append(_encode(event) + b"\n")
        yield b"".join(out)
