"""The emulator's state across a restart, as an API server keeps it in etcd.

On a clean stop (SIGTERM/SIGINT) the store is written to ``--state-file``; a start with that
file reads it back: every object, the resourceVersion counter, and the key that signs
service-account tokens (tokens issued before the restart stay valid). The change history is
not kept: a watch resuming from a version before the restart gets 410 Gone and re-lists, as
after an API server's restart against a compacted etcd.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .kinds import KINDS
from .records import Entry, encode
from .store import Store
from .tokens import SigningKey

_BY_PLURAL = {k.plural: k for k in KINDS}


class StateError(ValueError):
    """A state file that cannot be read back (which file, and why)."""


def dump(store: Store, path: Path) -> None:
    key = store.signing_key
    doc = {"rv": store.rv, "signing_key": {"secret": key.secret.hex(), "key_id": key.key_id},
           "objects": {plural: [e.obj for e in table.values()] for plural, table in store.objects.items()}}
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(doc))
    partial.replace(path)


def load(store: Store, path: Path) -> int:
    """Fill an empty ``store`` from ``path``; the number of objects read."""
    try:
        doc: Any = json.loads(path.read_text())
        rv, key, objects = int(doc["rv"]), doc["signing_key"], doc["objects"]
        store.signing_key = SigningKey(bytes.fromhex(key["secret"]), str(key["key_id"]))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise StateError(f"{path}: not a state file this emulator wrote ({err})") from None
    count = 0
    for plural, items in objects.items():
        kind = _BY_PLURAL.get(plural)
        if kind is None or not isinstance(items, list):
            raise StateError(f"{path}: unknown resource {plural!r}")
        for obj in items:
            meta = obj.get("metadata") or {}
            key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
            entry = Entry(obj, encode(obj))
            store.table(kind)[key] = entry
            store._index(kind, key, None, entry)
            count += 1
    store.rv = store.compacted = max(rv, store.rv)
    return count
