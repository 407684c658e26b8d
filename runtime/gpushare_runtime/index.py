"""A cache of which container each sibling bundle belongs to.

One small JSON file per bundle directory, under the configured ``index_dir``
(tmpfs in production: ``/run/gpushare/runtime-index``), mapping each bundle
directory name to its config.json version (inode and modification time) and
its ``ns/pod/container`` identity.  A replaced or re-created config.json has
another version, so a stale entry is never trusted.  It is only a
cache: a lost or corrupt file, a concurrent writer (the last rename wins), an
unwritable directory all fall back to reading the bundles themselves.
"""

from __future__ import annotations

from . import fastjson, posixfs

NOT_A_CONTAINER = ""


class BundleIndex:
    __slots__ = ("changed", "entries", "path")

    def __init__(self, path: str, entries: dict[str, list[object]]) -> None:
        self.path = path
        self.entries = entries
        self.changed = False

    @classmethod
    def load(cls, index_dir: str, parent: str) -> BundleIndex:
        name = parent.strip("/").replace("/", "_") or "_"
        path = posixfs.join(index_dir, name + ".json")
        try:
            with open(path, "rb") as handle:
                doc = fastjson.loads(handle.read())
            entries = doc["entries"] if doc.get("parent") == parent else {}  # type: ignore[attr-defined,index]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            entries = {}
        index = cls(path, entries if isinstance(entries, dict) else {})
        index.entries["\0parent"] = ["", parent]
        return index

    def identity(self, name: str, version: str) -> str | None:
        """The cached identity string of bundle ``name``, None when unknown or stale."""
        entry = self.entries.get(name)
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == version:
            value = entry[1]
            return value if isinstance(value, str) else None
        return None

    def remember(self, name: str, version: str, identity: str) -> None:
        self.entries[name] = [version, identity]
        self.changed = True

    def save(self, present: set[str]) -> None:
        """Write back (dropping bundles that are gone) if anything changed; errors are ignored."""
        gone = set(self.entries) - present - {"\0parent"}
        if not self.changed and not gone:
            return
        parent = self.entries.pop("\0parent")[1]
        entries = {k: v for k, v in self.entries.items() if k in present}
        temporary = f"{self.path}.{posixfs.getpid()}"
        try:
            posixfs.makedirs(posixfs.dirname(self.path), mode=0o700)
            with open(temporary, "w", encoding="utf-8") as handle:
                handle.write(fastjson.dumps({"parent": parent, "entries": entries}))
            posixfs.replace(temporary, self.path)
        except OSError:
            try:
                posixfs.unlink(temporary)
            except OSError:
                pass
