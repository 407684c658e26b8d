"""Reading an OCI bundle's config.json and writing it back atomically."""

from __future__ import annotations

from . import fastjson, posixfs

# typing costs milliseconds to import and every container create pays them
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SPEC_FILE = "config.json"


def spec_path(bundle: str) -> str:
    return posixfs.join(bundle, SPEC_FILE)


def read_raw(bundle: str) -> bytes:
    from .errors import BundleError

    try:
        with open(spec_path(bundle), "rb") as handle:
            return handle.read()
    except OSError as err:
        raise BundleError(bundle, f"cannot read {SPEC_FILE}: {err.strerror}") from None


def parse_spec(bundle: str, raw: bytes) -> dict[str, Any]:
    from .errors import BundleError

    try:
        spec = fastjson.loads(raw)
    except ValueError as err:
        raise BundleError(bundle, f"{SPEC_FILE} is not JSON: {err}") from None
    if not isinstance(spec, dict):
        raise BundleError(bundle, f"{SPEC_FILE} is not a JSON object")
    return spec


def write_spec(bundle: str, spec: dict[str, Any]) -> None:
    """Replace config.json in one rename, keeping its mode and owner; never half-written.

    No fsync: bundles live on tmpfs (``/run``), and the rename alone already
    guarantees that a reader sees the old spec or the new one, nothing between.
    """
    from .errors import BundleError

    path = spec_path(bundle)
    temporary = posixfs.join(bundle, f".{SPEC_FILE}.gpushare-{posixfs.getpid()}")
    data = fastjson.dumps(spec).encode()
    try:
        info = posixfs.stat(path)
        fd = posixfs.open(temporary, posixfs.O_WRONLY | posixfs.O_CREAT | posixfs.O_EXCL | posixfs.O_CLOEXEC, 0o600)
        try:
            posixfs.fchmod(fd, info.st_mode & 0o7777)
            posixfs.fchown(fd, info.st_uid, info.st_gid)
            view = memoryview(data)
            while view:
                view = view[posixfs.write(fd, view) :]
        finally:
            posixfs.close(fd)
        posixfs.replace(temporary, path)
    except OSError as err:
        try:
            posixfs.unlink(temporary)
        except OSError:
            pass
        raise BundleError(bundle, f"cannot write {SPEC_FILE}: {err.strerror}") from None
