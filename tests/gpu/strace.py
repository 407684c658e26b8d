"""Reading ``strace -f -y -e trace=ioctl`` output: which ioctl types hit which device files."""

from __future__ import annotations

_MACROS = ("_IOC(", "_IOWR(", "_IOW(", "_IOR(", "_IO(")


def _number(text: str) -> int | None:
    """``0x46``, ``70`` or ``'F'`` (strace prints a printable type as a character)."""
    if text.startswith("0x"):
        try:
            return int(text, 16)
        except ValueError:
            return None
    if len(text) == 3 and text[0] == text[2] == "'":
        return ord(text[1])
    return int(text) if text.isdigit() else None


def request_type(request: str) -> int | None:
    """The ``_IOC_TYPE`` of a request as strace shows it; None for a decoded or bare number."""
    for macro in _MACROS:
        if request.startswith(macro):
            args = [a.strip() for a in request[len(macro):].split(",")]
            index = 1 if macro == "_IOC(" else 0
            return _number(args[index]) if len(args) > index else None
    return None


def ioctl_types(text: str) -> dict[str, dict[int, int]]:
    """``{device path: {ioctl type: count}}`` over every ``ioctl(fd</path>, _IOC(...))`` line."""
    counts: dict[str, dict[int, int]] = {}
    for line in text.splitlines():
        start = line.find("ioctl(")
        if start < 0:
            continue
        fd, _, request = line[start + len("ioctl("):].partition(", ")
        if "<" not in fd:
            continue
        path = fd[fd.index("<") + 1:].split("<")[0].rstrip(">")
        kind = request_type(request)
        if kind is not None:
            per_path = counts.setdefault(path, {})
            per_path[kind] = per_path.get(kind, 0) + 1
    return counts
