"""Finding a source container's spec among the bundles beside the target's bundle.

containerd keeps one directory per container (named by its ID) under
``.../io.containerd.runtime.v2.task/<namespace>/``; CRI-O keeps
``.../overlay-containers/<id>/userdata``.  A node holds hundreds of bundles,
so each sibling's config.json is read as bytes and parsed only if the pod
and container names occur in it as JSON strings.  Several matches (a
restarted container leaves its old bundle until it is removed): the live one
wins, then the newest.
"""

from __future__ import annotations

from . import fastjson, posixfs
from .bundle import SPEC_FILE
from .index import NOT_A_CONTAINER, BundleIndex

# typing costs milliseconds to import and every container create pays them
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

IDENTITY_KEYS = (
    (
        "io.kubernetes.cri.sandbox-namespace",
        "io.kubernetes.cri.sandbox-name",
        "io.kubernetes.cri.container-name",
    ),
    ("io.kubernetes.pod.namespace", "io.kubernetes.pod.name", "io.kubernetes.container.name"),
)
PID_FILES = ("init.pid", "pidfile")


class Identity:
    __slots__ = ("container", "namespace", "pod")

    def __init__(self, namespace: str, pod: str, container: str) -> None:
        self.namespace = namespace
        self.pod = pod
        self.container = container

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Identity) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.namespace, self.pod, self.container)

    def __str__(self) -> str:
        return "/".join(self.key)


class IdentityConflict(ValueError):
    """A spec whose two families of identity keys name different containers."""

    def __init__(self, keys: tuple[str, str], values: tuple[object, object]) -> None:
        self.keys = keys
        self.values = values
        super().__init__(f"identity keys disagree: {keys[0]}={values[0]!r} but {keys[1]}={values[1]!r}")


def identity_of(spec: dict[str, Any]) -> Identity | None:
    """The container's identity from containerd's or CRI-O's keys; :class:`IdentityConflict`
    when both families are present and any key of one contradicts the other's."""
    annotations = spec.get("annotations")
    if not isinstance(annotations, dict):
        return None
    first, second = IDENTITY_KEYS
    for pair in zip(first, second, strict=True):
        values = (annotations.get(pair[0]), annotations.get(pair[1]))
        if values[0] is not None and values[1] is not None and values[0] != values[1]:
            raise IdentityConflict(pair, values)
    for keys in IDENTITY_KEYS:
        namespace, pod, container = (annotations.get(key) for key in keys)
        if (
            isinstance(namespace, str) and namespace
            and isinstance(pod, str) and pod
            and isinstance(container, str) and container
        ):
            return Identity(namespace, pod, container)
    return None


def _sibling_identity(spec: dict[str, Any]) -> Identity | None:
    """A sibling's identity; one with contradictory keys is no source (its own create fails)."""
    try:
        return identity_of(spec)
    except IdentityConflict:
        return None


class SourceBundle:
    __slots__ = ("live", "mtime", "path", "spec")

    def __init__(self, path: str, spec: dict[str, Any], live: bool, mtime: float) -> None:
        self.path = path
        self.spec = spec
        self.live = live
        self.mtime = mtime

    @property
    def container_id(self) -> str:
        name = posixfs.basename(self.path)
        return posixfs.basename(posixfs.dirname(self.path)) if name == "userdata" else name


def bundle_parent(target_bundle: str) -> tuple[str, tuple[str, ...]]:
    """The directory holding the bundles, and the path inside each entry (CRI-O: userdata)."""
    target = posixfs.normpath(target_bundle)
    if posixfs.basename(target) == "userdata":
        return posixfs.dirname(posixfs.dirname(target)), ("userdata",)
    return posixfs.dirname(target), ()


def sibling_bundles(target_bundle: str) -> list[tuple[str, str]]:
    """(name, bundle path) of every bundle beside ``target_bundle``, itself excluded."""
    target = posixfs.normpath(target_bundle)
    parent, suffix = bundle_parent(target)
    try:
        names = posixfs.listdir(parent)
    except OSError:
        return []
    # string concatenation, not a path join: this runs once per sibling on every create
    prefix, tail = parent.rstrip("/") + "/", "".join("/" + part for part in suffix)
    found = [(name, prefix + name + tail) for name in names]
    return [entry for entry in found if entry[1] != target]


def _version(path: str) -> str:
    """Changes whenever the bundle's config.json is replaced or rewritten."""
    try:
        info = posixfs.stat(f"{path}/{SPEC_FILE}")
    except OSError:
        return ""
    return f"{info.st_ino}:{info.st_mtime_ns}"


def _is_live(bundle: str) -> bool:
    for name in PID_FILES:
        try:
            with open(posixfs.join(bundle, name), "rb") as handle:
                pid = int(handle.read().strip() or b"0")
        except (OSError, ValueError):
            continue
        if pid > 0 and posixfs.exists(f"/proc/{pid}"):
            return True
    return False


def _read(path: str, needles: tuple[bytes, ...]) -> tuple[dict[str, Any], float] | None:
    """The bundle's spec and mtime, None if unreadable or (cheaply) not containing the needles."""
    try:
        with open(posixfs.join(path, SPEC_FILE), "rb") as handle:
            raw = handle.read()
            mtime = posixfs.fstat(handle.fileno()).st_mtime
    except OSError:
        return None
    if not all(needle in raw for needle in needles):
        return None
    try:
        spec = fastjson.loads(raw)
    except ValueError:
        return None
    return (spec, mtime) if isinstance(spec, dict) else None


def _better(found: SourceBundle, best: SourceBundle | None) -> bool:
    return best is None or (found.live, found.mtime) > (best.live, best.mtime)


def find_source(
    target_bundle: str, wanted: Identity, index_dir: str | None = None
) -> SourceBundle | None:
    """The live, else the newest, bundle of container ``wanted`` beside the target.

    Without ``index_dir`` every sibling is read, and parsed only if the pod and
    container names occur in it; with it, only bundles not yet in the index
    and those the index names as ``wanted`` are read.
    """
    siblings = sibling_bundles(target_bundle)
    index = None
    if index_dir:
        index = BundleIndex.load(index_dir, bundle_parent(target_bundle)[0])
    needles = tuple(fastjson.dumps(part).encode() for part in (wanted.pod, wanted.container))
    best: SourceBundle | None = None
    wanted_key = str(wanted)
    for name, path in siblings:
        version = _version(path) if index else ""
        known = index.identity(name, version) if index else None
        if known is not None and known != wanted_key:
            continue
        loaded = _read(path, () if index and known is None else needles)
        identity = _sibling_identity(loaded[0]) if loaded else None
        if index and known is None and loaded:
            index.remember(name, version, str(identity) if identity else NOT_A_CONTAINER)
        if loaded and identity == wanted:
            found = SourceBundle(path, loaded[0], _is_live(path), loaded[1])
            best = found if _better(found, best) else best
    if index:
        index.save({name for name, _ in siblings})
    return best
