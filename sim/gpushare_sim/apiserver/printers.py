"""What `kubectl get` shows for each kind: the API server's table columns and cells.

The columns and the way cells are worked out follow the API server's own
printers (pod READY/STATUS/RESTARTS, node STATUS/ROLES, event OBJECT, ...); a
kind without a printer gets the server's default table, NAME and CREATED AT.
Every cell is computed, the priority-1 ones too: kubectl hides those unless
`-o wide`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

Obj = dict[str, Any]
Cells = list[Any]


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    priority: int = 0
    type: str = "string"
    format: str = ""

    def definition(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "format": self.format, "description": "",
                "priority": self.priority}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Printer:
    columns: tuple[Column, ...]
    cells: Callable[[Obj, float], Cells]


def human_duration(seconds: float) -> str:
    """How long ago, as kubectl writes it: 5s, 3m20s, 15m, 4h12m, 2d3h, 400d, 2y30d."""
    whole = int(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 120:
        return f"{max(whole, 0)}s"
    minutes, hours, days = whole // 60, whole // 3600, whole // 86400
    if minutes < 10:
        return _pair(minutes, "m", whole % 60, "s")
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return _pair(hours, "h", minutes % 60, "m")
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return _pair(days, "d", hours % 24, "h")
    if days < 365 * 2:
        return f"{days}d"
    if days < 365 * 8:
        return _pair(days // 365, "y", days % 365, "d")
    return f"{days // 365}y"


def _pair(big: int, big_unit: str, small: int, small_unit: str) -> str:
    return f"{big}{big_unit}" if small == 0 else f"{big}{big_unit}{small}{small_unit}"


def timestamp(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def since(text: Any, now: float) -> str:
    moment = timestamp(text)
    return "<unknown>" if moment is None else human_duration(now - moment)


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _part(obj: Obj, name: str) -> Obj:
    part = obj.get(name)
    return part if isinstance(part, dict) else {}


def age(obj: Obj, now: float) -> str:
    return since(_meta(obj).get("creationTimestamp"), now)


NAME = Column("Name", format="name")
AGE = Column("Age")


def _name_age(obj: Obj, now: float) -> Cells:
    return [_meta(obj).get("name", ""), age(obj, now)]


def _default(obj: Obj, now: float) -> Cells:
    return [_meta(obj).get("name", ""), _meta(obj).get("creationTimestamp", "")]


DEFAULT = Printer((NAME, Column("Created At", type="date")), _default)
NAME_AGE = Printer((NAME, AGE), _name_age)


def _slice_cells(obj: Obj, now: float) -> Cells:
    spec = _part(obj, "spec")
    node = spec.get("nodeName") or "<none>"
    return [_meta(obj).get("name", ""), node, spec.get("driver", ""), _part(spec, "pool").get("name", ""),
            age(obj, now)]  # fmt: skip


def claim_state(obj: Obj) -> str:
    """pending, allocated, allocated,reserved, deleted, ..."""
    status, states = _part(obj, "status"), []
    deleted = bool(_meta(obj).get("deletionTimestamp"))
    if deleted:
        states.append("deleted")
    if not status.get("allocation"):
        if not deleted:
            states.append("pending")
    else:
        states.append("allocated")
        if status.get("reservedFor"):
            states.append("reserved")
    return ",".join(states)


def _claim_cells(obj: Obj, now: float) -> Cells:
    return [_meta(obj).get("name", ""), claim_state(obj), age(obj, now)]


RESOURCE: dict[str, Printer] = {
    "deviceclasses": NAME_AGE,
    "resourceslices": Printer((NAME, Column("Node"), Column("Driver"), Column("Pool"), AGE), _slice_cells),
    "resourceclaims": Printer((NAME, Column("State"), AGE), _claim_cells),
    "resourceclaimtemplates": NAME_AGE,
}
