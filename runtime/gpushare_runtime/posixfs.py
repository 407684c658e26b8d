"""The few ``os`` and ``os.path`` services the create path needs, on ``posix`` alone.

``import os`` executes ``os``, ``posixpath``, ``stat``, ``genericpath`` and
``_collections_abc`` (the ABCs behind ``os.environ``): more than a millisecond of every
container create.  ``posix`` is built into the interpreter.  The helpers below give
the results of their ``os.path`` namesakes for ``str`` paths (a property test checks).
"""

from __future__ import annotations

from posix import (
    O_APPEND,
    O_CLOEXEC,
    O_CREAT,
    O_EXCL,
    O_WRONLY,
    close,
    environ,
    execv,
    fchmod,
    fchown,
    fstat,
    getcwd,
    getpid,
    listdir,
    mkdir,
    open,
    replace,
    stat,
    unlink,
    write,
)

__all__ = [
    "O_APPEND", "O_CLOEXEC", "O_CREAT", "O_EXCL", "O_WRONLY", "abspath", "basename", "close",
    "dirname", "execvp", "exists", "fchmod", "fchown", "fstat", "getcwd", "getenv", "getpid",
    "join", "listdir", "makedirs", "normpath", "open", "replace", "stat", "unlink", "write",
]

DEFAULT_PATH = "/bin:/usr/bin"  # os.defpath


def getenv(name: str, default: str = "") -> str:
    value = environ.get(name.encode())
    return default if value is None else value.decode("utf-8", "surrogateescape")


def join(first: str, *rest: str) -> str:
    path = first
    for part in rest:
        if part.startswith("/"):
            path = part
        elif not path or path.endswith("/"):
            path += part
        else:
            path += "/" + part
    return path


def normpath(path: str) -> str:
    if not path:
        return "."
    leading = 2 if path.startswith("//") and not path.startswith("///") else int(path.startswith("/"))
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part != ".." or (not leading and not parts) or (parts and parts[-1] == ".."):
            parts.append(part)
        elif parts:
            parts.pop()
    return "/" * leading + "/".join(parts) or "."


def abspath(path: str) -> str:
    return normpath(path if path.startswith("/") else join(getcwd(), path))


def dirname(path: str) -> str:
    head = path[: path.rfind("/") + 1]
    return head.rstrip("/") if head and head != "/" * len(head) else head


def basename(path: str) -> str:
    return path[path.rfind("/") + 1 :]


def exists(path: str) -> bool:
    try:
        stat(path)
    except (OSError, ValueError):
        return False
    return True


def makedirs(path: str, mode: int = 0o777) -> None:
    """``os.makedirs(path, mode, exist_ok=True)``."""
    try:
        mkdir(path, mode)
    except FileNotFoundError:
        parent = dirname(path)
        if not parent or parent == path:
            raise
        makedirs(parent, mode)
        makedirs(path, mode)
    except FileExistsError:
        if not exists(path) or (stat(path).st_mode & 0o170000) != 0o040000:
            raise


def execvp(file: str, args: list[str]) -> None:
    """Run ``file`` in place of this process, searched in ``PATH`` unless it has a slash."""
    if "/" in file:
        execv(file, args)
    first_error: OSError | None = None
    last_error: OSError = FileNotFoundError(2, "No such file or directory", file)
    for directory in getenv("PATH", DEFAULT_PATH).split(":"):
        try:
            execv(join(directory or ".", file), args)
        except (FileNotFoundError, NotADirectoryError) as err:
            last_error = err
        except OSError as err:
            last_error = err
            first_error = first_error or err
    raise first_error or last_error
