"""Temporary directories with short paths: a unix socket's path is at most 107 bytes.

:func:`short_mkdtemp` makes one in the process's temporary directory (``TMPDIR``; ``make test``
points it at a tmpfs, where creating a file costs a twentieth of the disk's) when that path is
short, else in ``/tmp``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

SHORT = 24  # the longest temporary directory a socket path under it still fits beside


def short_root() -> str:
    root = tempfile.gettempdir()
    return root if len(root) <= SHORT else "/tmp"


def short_mkdtemp(prefix: str) -> Path:
    """A fresh directory ``<short root>/<prefix>XXXXXXXX``; the caller removes it."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=short_root()))
