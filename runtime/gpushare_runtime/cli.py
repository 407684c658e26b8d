"""runc's command line, read just far enough to find the command, the bundle and the log.

Global flags come before the command (``--root DIR``, ``--log FILE``,
``--log-format json``, ``--systemd-cgroup``, ...); urfave/cli accepts ``-x`` and
``--x``, ``--x=v`` and ``--x v``.  Nothing here changes the arguments: the
lower runtime always receives exactly what this runtime was given.
"""

from __future__ import annotations

from . import posixfs

GLOBAL_VALUE_FLAGS = frozenset({"log", "log-format", "root", "criu", "rootless"})
CREATE_VALUE_FLAGS = frozenset(
    {"bundle", "b", "console-socket", "pid-file", "preserve-fds", "pidfd-socket"}
)
SPEC_COMMANDS = frozenset({"create", "run"})


class Invocation:
    """What this call to the runtime is about."""

    __slots__ = ("bundle", "command", "container_id", "log_format", "log_path", "root")

    def __init__(self) -> None:
        self.command: str | None = None
        self.log_path: str | None = None
        self.log_format = "text"
        self.root: str | None = None
        self.bundle: str | None = None
        self.container_id: str | None = None

    @property
    def edits_spec(self) -> bool:
        return self.command in SPEC_COMMANDS


def _flag(arg: str) -> tuple[str, str | None]:
    """``--name=value`` -> (name, value); ``-n`` -> (n, None)."""
    name, eq, value = arg.lstrip("-").partition("=")
    return name, (value if eq else None)


def _scan(args: list[str], start: int, value_flags: frozenset[str]) -> tuple[dict[str, str], int]:
    """Read flags from ``start`` up to the first positional; return them and its index."""
    found: dict[str, str] = {}
    index = start
    while index < len(args):
        arg = args[index]
        if arg == "--":
            return found, index + 1
        if not arg.startswith("-") or arg == "-":
            return found, index
        name, value = _flag(arg)
        if name in value_flags and value is None:
            index += 1
            value = args[index] if index < len(args) else ""
        found[name] = value if value is not None else "true"
        index += 1
    return found, index


def parse_invocation(args: list[str]) -> Invocation:
    invocation = Invocation()
    flags, index = _scan(args, 0, GLOBAL_VALUE_FLAGS)
    invocation.log_path = flags.get("log") or None
    invocation.log_format = flags.get("log-format", "text")
    invocation.root = flags.get("root")
    if index >= len(args):
        return invocation
    invocation.command = args[index]
    if not invocation.edits_spec:
        return invocation
    command_flags, position = _scan(args, index + 1, CREATE_VALUE_FLAGS)
    bundle = command_flags.get("bundle") or command_flags.get("b") or "."
    invocation.bundle = posixfs.abspath(bundle)
    if position < len(args):
        invocation.container_id = args[position]
    return invocation
