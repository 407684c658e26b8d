"""Lines in the runtime log containerd passed (``--log FILE --log-format json|text``).

The same shapes runc (logrus) writes: JSON ``{"level","msg","time"}`` lines, or
``time="..." level=info msg="..."`` text lines.
"""

from __future__ import annotations

import sys
import time

from . import fastjson, posixfs


def _timestamp() -> str:
    now = time.time()
    local = time.localtime(now)
    offset = local.tm_gmtoff
    sign = "+" if offset >= 0 else "-"
    zone = "Z" if offset == 0 else f"{sign}{abs(offset) // 3600:02d}:{abs(offset) % 3600 // 60:02d}"
    fraction = f"{now % 1:.9f}"[1:]
    return time.strftime("%Y-%m-%dT%H:%M:%S", local) + fraction + zone


def format_line(level: str, message: str, log_format: str) -> str:
    stamp = _timestamp()
    if log_format == "json":
        record = {"level": level, "msg": message, "time": stamp}
        return fastjson.dumps(record) + "\n"
    return f"time={fastjson.dumps(stamp)} level={level} msg={fastjson.dumps(message)}\n"


class RuntimeLog:
    """Appends to the runtime log, if any; errors also go to stderr."""

    def __init__(self, path: str | None, log_format: str) -> None:
        self.path = path
        self.log_format = log_format

    def write(self, level: str, message: str) -> None:
        if not self.path:
            return
        line = format_line(level, message, self.log_format).encode()
        try:
            flags = posixfs.O_WRONLY | posixfs.O_APPEND | posixfs.O_CREAT | posixfs.O_CLOEXEC
            fd = posixfs.open(self.path, flags, 0o644)
        except OSError:
            return
        try:
            posixfs.write(fd, line)
        finally:
            posixfs.close(fd)

    def info(self, message: str) -> None:
        self.write("info", message)

    def error(self, message: str) -> None:
        """The log first: containerd reads the error from it, and a caller's stderr may be a pipe
        nobody reads any more (a write there then fails, and must not lose the log's line)."""
        self.write("error", message)
        try:
            sys.stderr.write(f"gpushare-runtime: {message}\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed or broken stderr: the log has it
            pass
