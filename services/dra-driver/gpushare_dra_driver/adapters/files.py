"""The node's files: CDI spec files, the prepared-claims state, capped shares' directories.

Every write goes to a temporary file in the same directory, then replaces the target in
one rename: a reader (the container runtime) sees the old file or the new one, never half.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from ..cdi import spec_file_name
from ..state import PreparedState, decode


def write_atomically(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)  # whatever the umask
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.replace(tmp, path)


class NodeFiles:
    def __init__(self, cdi_dir: str, state_file: str) -> None:
        self.cdi_dir = Path(cdi_dir)
        self.state_path = Path(state_file)
        self._prefix, _, self._suffix = spec_file_name("*").partition("*")

    def write_spec(self, name: str, doc: dict[str, Any]) -> None:
        write_atomically(self.cdi_dir / name, msgspec.json.encode(doc, order="sorted"))

    def read_spec(self, name: str) -> object:
        """A spec file of this driver decoded; None when it cannot be read or decoded."""
        try:
            return msgspec.json.decode((self.cdi_dir / name).read_bytes())
        except (OSError, msgspec.DecodeError):
            return None

    def has_spec(self, name: str) -> bool:
        return os.path.exists(self.cdi_dir / name)

    def remove_spec(self, name: str) -> None:
        try:
            os.unlink(self.cdi_dir / name)
        except FileNotFoundError:
            pass

    def spec_names(self) -> list[str]:
        """This driver's spec files in the CDI directory (others' are left alone)."""
        try:
            names = os.listdir(self.cdi_dir)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if n.startswith(self._prefix) and n.endswith(self._suffix))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def make_dirs(self, paths: Sequence[str]) -> None:
        for path in paths:
            if not os.path.isdir(path):  # one stat when it is there (every prepare after the first)
                os.makedirs(path, mode=0o777, exist_ok=True)

    def drop_state(self) -> None:
        """Remove the state file of older versions (its records now live in the spec files)."""
        try:
            os.unlink(self.state_path)
        except FileNotFoundError:
            pass

    def load_state(self) -> PreparedState:
        try:
            data = self.state_path.read_bytes()
        except FileNotFoundError:
            return PreparedState()
        return decode(str(self.state_path), data)
