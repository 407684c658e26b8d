"""Bind, then report: a server binds its own port and says which one it got.

A server given port 0 listens on whatever port the kernel hands it. A launcher that needs the
address (the local cluster, a test) gives the server a directory; once listening, the server
writes ``<dir>/<program>_<pid>.ports``, a JSON object of its listeners by kind, each a list of
URLs, in the format nats-server writes with ``ports_file_dir``::

    {"http": ["http://127.0.0.1:39185"]}
    {"nats": ["nats://127.0.0.1:40417"], "cluster": ["nats://127.0.0.1:35221"], "monitoring": [...]}

so one reader serves every child: :func:`read_ports` by the child's pid. Nothing picks a free port
and hopes it is still free when the server binds it. A port that cannot be bound raises
:class:`BindError`, which names the address (a service prints it as one line and exits).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["BindError", "listen", "port_of", "ports_file", "read_ports", "remove_ports", "write_ports"]


class BindError(OSError):
    """The server could not listen on ``address``."""

    def __init__(self, address: str, reason: str) -> None:
        self.address = address
        self.reason = reason
        super().__init__(f"cannot listen on {address}: {reason} (another process may hold it; "
                         "choose another port, or 0 for any free one)")  # fmt: skip


def listen(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``port`` 0: any free one) and listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=backlog)
    except OSError as err:
        raise BindError(f"{host}:{port}", err.strerror or str(err)) from None


def ports_file(directory: str | Path, program: str, pid: int | None = None) -> Path:
    return Path(directory) / f"{program}_{os.getpid() if pid is None else pid}.ports"


def write_ports(directory: str | Path, program: str, listeners: Mapping[str, Sequence[str]]) -> Path:
    """Write this process's ports file whole (a rename: a reader never sees half of it)."""
    path = ports_file(directory, program)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps({kind: list(urls) for kind, urls in listeners.items()}))
    partial.replace(path)
    return path


def remove_ports(directory: str | Path, program: str) -> None:
    with contextlib.suppress(OSError):
        ports_file(directory, program).unlink()


def read_ports(directory: str | Path, pid: int) -> dict[str, list[str]] | None:
    """The listeners process ``pid`` reported in ``directory``; None until it has written them
    (also while a writer that does not rename, such as nats-server, is half way)."""
    for path in Path(directory).glob(f"*_{pid}.ports"):
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if isinstance(found, dict) and found and all(isinstance(v, list) for v in found.values()):
            return {str(kind): [str(url) for url in urls] for kind, urls in found.items()}
        return None
    return None


def port_of(url: str) -> int:
    """The port of a listener's URL (``nats://127.0.0.1:4222`` -> 4222)."""
    port = urlsplit(url).port
    if port is None:
        raise ValueError(f"{url!r} names no port")
    return port
