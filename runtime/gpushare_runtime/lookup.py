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

import json
import os
from typing import Any

from .bundle import SPEC_FILE

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


def identity_of(spec: dict[str, Any]) -> Identity | None:
    annotations = spec.get("annotations")
    if not isinstance(annotations, dict):
        return None
    for keys in IDENTITY_KEYS:
        namespace, pod, container = (annotations.get(key) for key in keys)
        if (
            isinstance(namespace, str) and namespace
            and isinstance(pod, str) and pod
            and isinstance(container, str) and container
        ):
            return Identity(namespace, pod, container)
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
        name = os.path.basename(self.path)
        return os.path.basename(os.path.dirname(self.path)) if name == "userdata" else name


def sibling_bundles(target_bundle: str) -> list[str]:
    """Every bundle directory beside ``target_bundle`` (itself excluded)."""
    target = os.path.normpath(target_bundle)
    crio = os.path.basename(target) == "userdata"
    parent = os.path.dirname(os.path.dirname(target) if crio else target)
    try:
        entries = os.listdir(parent)
    except OSError:
        return []
    suffix = ("userdata",) if crio else ()
    paths = (os.path.join(parent, entry, *suffix) for entry in entries)
    return [path for path in paths if path != target]


def _is_live(bundle: str) -> bool:
    for name in PID_FILES:
        try:
            with open(os.path.join(bundle, name), "rb") as handle:
                pid = int(handle.read().strip() or b"0")
        except (OSError, ValueError):
            continue
        if pid > 0 and os.path.exists(f"/proc/{pid}"):
            return True
    return False


def _candidate(path: str, needles: tuple[bytes, ...], wanted: Identity) -> SourceBundle | None:
    spec_file = os.path.join(path, SPEC_FILE)
    try:
        with open(spec_file, "rb") as handle:
            raw = handle.read()
            mtime = os.fstat(handle.fileno()).st_mtime
    except OSError:
        return None
    if not all(needle in raw for needle in needles):
        return None
    try:
        spec = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(spec, dict) or identity_of(spec) != wanted:
        return None
    return SourceBundle(path, spec, _is_live(path), mtime)


def find_source(target_bundle: str, wanted: Identity) -> SourceBundle | None:
    """The live, else the newest, bundle of container ``wanted`` beside the target."""
    needles = tuple(json.dumps(part).encode() for part in (wanted.pod, wanted.container))
    best: SourceBundle | None = None
    for path in sibling_bundles(target_bundle):
        found = _candidate(path, needles, wanted)
        if found and (best is None or (found.live, found.mtime) > (best.live, best.mtime)):
            best = found
    return best
