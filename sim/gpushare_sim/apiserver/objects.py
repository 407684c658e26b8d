"""Write semantics on top of the store: create, update, patch, delete, bind."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from . import errors
from .kind import Kind, valid_name
from .patch import PatchError, apply_patch
from .store import Entry, Key, Obj, Store

# metadata fields the server owns: a client cannot change them by update or patch
_SERVER_META = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds")


def now_rfc3339(offset: float = 0.0) -> str:
    moment = datetime.now(UTC) + timedelta(seconds=offset)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Target:
    """The object a request names."""

    kind: Kind
    namespace: str  # "" for cluster-scoped kinds
    name: str

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)


def require(store: Store, target: Target) -> Entry:
    entry = store.get(target.kind, target.key)
    if entry is None:
        raise errors.not_found(target.kind.plural, target.name, target.kind.group)
    return entry


def _check_version(target: Target, entry: Entry, wanted: Any) -> None:
    if wanted not in (None, "") and str(wanted) != entry.obj["metadata"]["resourceVersion"]:
        raise errors.stale(target.kind.plural, target.name, target.kind.group)


def create(store: Store, kind: Kind, namespace: str, obj: Obj) -> Entry:
    meta = obj.setdefault("metadata", {})
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
    name = meta.get("name") or ""
    if not valid_name(name):
        raise errors.invalid(kind.kind, name, [("metadata.name", f"Invalid value: {name!r}")])
    if kind.namespaced:
        meta["namespace"] = namespace
    else:
        meta.pop("namespace", None)
    if store.get(kind, (namespace, name)) is not None:
        raise errors.already_exists(kind.plural, name, kind.group)
    for server_field in (*_SERVER_META, "resourceVersion"):
        meta.pop(server_field, None)
    meta["uid"] = str(uuid.uuid4())
    meta["creationTimestamp"] = now_rfc3339()
    meta["generation"] = 1
    obj["kind"], obj["apiVersion"] = kind.kind, kind.api_version
    kind.on_create(obj)
    return store.put(kind, (namespace, name), obj)


def update(store: Store, target: Target, obj: Obj, *, status: bool = False) -> Entry:
    """PUT: replace the object (or only its status), honouring resourceVersion."""
    entry = require(store, target)
    _check_version(target, entry, obj.get("metadata", {}).get("resourceVersion"))
    return _write(store, target, entry, obj, status)


def _write(store: Store, target: Target, entry: Entry, new: Obj, status: bool) -> Entry:
    old = entry.copy()
    new = _merge_status(target.kind, old, new) if status else _keep_status(target.kind, old, new)
    meta = new.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise errors.bad_request("metadata must be an object")
    for server_field in _SERVER_META:
        _copy_field(old["metadata"], meta, server_field)
    if "managedFields" not in meta and "managedFields" in old["metadata"]:
        meta["managedFields"] = old["metadata"]["managedFields"]  # an update that omits them keeps them
    meta["name"] = target.name
    if target.kind.namespaced:
        meta["namespace"] = target.namespace
    new["kind"], new["apiVersion"] = target.kind.kind, target.kind.api_version
    target.kind.on_update(old, new)
    generation = old["metadata"].get("generation", 1)
    meta["generation"] = generation + (1 if new.get("spec") != old.get("spec") else 0)
    probe = {**new, "metadata": {**meta, "resourceVersion": old["metadata"]["resourceVersion"]}}
    if probe == old:
        return entry  # nothing changed: no new version, no event
    return store.put(target.kind, target.key, new)


def _copy_field(source: Obj, dest: Obj, name: str) -> None:
    if name in source:
        dest[name] = source[name]
    else:
        dest.pop(name, None)


def _keep_status(kind: Kind, old: Obj, new: Obj) -> Obj:
    if kind.status_subresource:
        _copy_field(old, new, "status")
    return new


def _merge_status(kind: Kind, old: Obj, new: Obj) -> Obj:
    """The status subresource: the old object with the new status, nothing else."""
    result = dict(old)
    _copy_field(new, result, "status")
    result["metadata"] = dict(old["metadata"])
    if "resourceVersion" in new.get("metadata", {}):
        result["metadata"]["resourceVersion"] = new["metadata"]["resourceVersion"]
    return result


def patch(
    store: Store,
    target: Target,
    content_type: str,
    body: Any,
    *,
    status: bool = False,
    validate: Callable[[Obj], None] = lambda obj: None,
) -> Entry:
    """PATCH: apply the patch to the stored object; a resourceVersion in it is a precondition."""
    entry = require(store, target)
    try:
        patched = apply_patch(content_type, entry.copy(), body)
    except PatchError as error:
        raise errors.ApiError(error.code, str(error)) from None
    if not isinstance(patched, dict) or not isinstance(patched.get("metadata", {}), dict):
        raise errors.ApiError(422, "the patched object is not a Kubernetes object")
    validate(patched)
    wanted = patched.get("metadata", {}).get("resourceVersion")
    _check_version(target, entry, wanted)
    return _write(store, target, entry, patched, status)


@dataclass(frozen=True, slots=True)
class DeleteOptions:
    grace_period: int | None = None
    uid: str | None = None
    resource_version: str | None = None


def delete(store: Store, target: Target, options: DeleteOptions) -> tuple[Entry, bool]:
    """Delete; returns (object, removed). A pod on a node goes Terminating first."""
    entry = require(store, target)
    meta = entry.obj["metadata"]
    check_preconditions(target, entry, options)
    if not _graceful(target.kind, entry.obj, options.grace_period):
        return store.remove(target.kind, target.key), True
    if "deletionTimestamp" in meta:
        return entry, False
    grace = options.grace_period
    if grace is None:
        grace = int((entry.obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
    pod = entry.copy()
    pod["metadata"]["deletionTimestamp"] = now_rfc3339(grace)
    pod["metadata"]["deletionGracePeriodSeconds"] = grace
    return store.put(target.kind, target.key, pod), False


def check_preconditions(target: Target, entry: Entry, options: DeleteOptions) -> None:
    if options.uid is not None and options.uid != entry.obj["metadata"].get("uid"):
        raise errors.conflict(target.kind.plural, target.name, "Precondition failed: UID")
    _check_version(target, entry, options.resource_version)


def _graceful(kind: Kind, obj: Obj, grace: int | None) -> bool:
    if not kind.graceful_delete or grace == 0:
        return False
    if not (obj.get("spec") or {}).get("nodeName"):
        return False
    return (obj.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def bind(store: Store, target: Target, node: str) -> None:
    """pods/binding: set spec.nodeName once."""
    entry = require(store, target)
    pod = entry.copy()
    spec = pod.setdefault("spec", {})
    if spec.get("nodeName"):
        raise errors.conflict(
            "pods", target.name, f"pod {target.name} is already assigned to node {spec['nodeName']!r}"
        )
    if "deletionTimestamp" in pod["metadata"]:
        raise errors.conflict("pods", target.name, "pod is being deleted")
    spec["nodeName"] = node
    store.put(target.kind, target.key, pod)
