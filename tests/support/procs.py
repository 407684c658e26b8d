"""Track child processes so a fixture can fail tests that leave processes behind."""

from __future__ import annotations

import os
from pathlib import Path

_allowed: set[int] = set()


def allow(pid: int) -> None:
    _allowed.add(pid)


def disallow(pid: int) -> None:
    _allowed.discard(pid)


def children() -> set[int]:
    """Live (non-zombie) direct children of this process."""
    me = os.getpid()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == me and fields[0] != "Z":
            found.add(int(entry.name))
    return found


def leaked(before: set[int]) -> set[int]:
    return children() - before - _allowed
