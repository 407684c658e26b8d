"""Namespace lifecycle, as the API server and its namespace and service-account
controllers give it: the system namespaces exist from the start, each namespace
gets a `default` ServiceAccount, a namespaced object needs an existing, active
namespace, and deleting a namespace deletes everything in it (the namespace
stays Terminating until the last object is gone, e.g. a pod its node still has
to stop)."""

from __future__ import annotations

from . import errors, objects
from .kinds import KINDS, NAMESPACES, SERVICEACCOUNTS, Kind
from .objects import DeleteOptions, Target, now_rfc3339
from .store import Entry, Obj, Store

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease", "gpushare-system")
_UNDELETABLE = ("default", "kube-system", "kube-public")
_NAMESPACED = tuple(k for k in KINDS if k.namespaced and k.stored)


def bootstrap(store: Store) -> None:
    """The namespaces (and their default ServiceAccounts) a fresh cluster has."""
    for name in SYSTEM_NAMESPACES:
        if store.get(NAMESPACES, ("", name)) is None:
            create(store, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def create(store: Store, body: Obj) -> Entry:
    entry = objects.create(store, NAMESPACES, "", body)
    name = entry.obj["metadata"]["name"]
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
    objects.create(store, SERVICEACCOUNTS, name, account)
    return entry


def require_active(store: Store, kind: Kind, namespace: str, name: str) -> None:
    """Creating `name` in `namespace` needs the namespace, and it must not be terminating."""
    found = store.get(NAMESPACES, ("", namespace))
    if found is None:
        raise errors.not_found("namespaces", namespace)
    if "deletionTimestamp" in found.obj["metadata"]:
        raise errors.ApiError(
            403,
            f'{kind.resource} "{name}" is forbidden: unable to create new content in namespace '
            f"{namespace} because it is being terminated",
            reason="Forbidden",
            details={"name": name, "group": kind.group, "kind": kind.plural,
                     "causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace",
                                 "message": "namespace is being terminated"}]},
        )  # fmt: skip


def delete(store: Store, target: Target, options: DeleteOptions) -> tuple[Entry, bool]:
    """Delete any object; a namespace is emptied first and goes once empty."""
    if target.kind is not NAMESPACES:
        entry, removed = objects.delete(store, target, options)
        if removed and target.kind.namespaced:
            finalize(store, target.namespace)
        return entry, removed
    if target.name in _UNDELETABLE:
        raise errors.ApiError(403, f'namespaces "{target.name}" is forbidden: this namespace may not be deleted',
                              reason="Forbidden", details={"name": target.name, "kind": "namespaces"})  # fmt: skip
    entry = objects.require(store, target)
    objects.check_preconditions(target, entry, options)
    if "deletionTimestamp" not in entry.obj["metadata"]:
        terminating = entry.copy()
        terminating["metadata"]["deletionTimestamp"] = now_rfc3339()
        terminating["status"] = {"phase": "Terminating"}
        entry = store.put(NAMESPACES, target.key, terminating)
        _empty(store, target.name)
    gone = _finalized(store, target.name)
    return (entry, False) if gone is None else (gone, True)


def _empty(store: Store, namespace: str) -> None:
    for kind in _NAMESPACED:
        for key in [key for key in store.table(kind) if key[0] == namespace]:
            entry = store.table(kind).get(key)
            if entry is not None and "deletionTimestamp" not in entry.obj["metadata"]:
                objects.delete(store, Target(kind, namespace, key[1]), DeleteOptions())


def finalize(store: Store, namespace: str) -> None:
    """After an object in `namespace` is gone: remove the namespace if it is terminating and empty."""
    _finalized(store, namespace)


def _finalized(store: Store, namespace: str) -> Entry | None:
    entry = store.get(NAMESPACES, ("", namespace))
    if entry is None or "deletionTimestamp" not in entry.obj["metadata"]:
        return None
    if any(key[0] == namespace for kind in _NAMESPACED for key in store.table(kind)):
        return None
    return store.remove(NAMESPACES, ("", namespace))
