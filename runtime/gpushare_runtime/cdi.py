"""Container Device Interface specs (CDI 0.3.0 to 1.1.0): ``<kind>=<name>`` to container edits.

Spec files (``*.json``, ``*.yaml``, ``*.yml``) in the configured directories; a
device named in a later directory overrides one of an earlier directory; two
files of one directory naming the same device make it unresolvable, as in the
CDI reference implementation.  A requested device gets, in the specification's
merge order, its spec's ``containerEdits`` (once per spec, the first time one
of its devices is requested) and then its own; :mod:`.cdiedits` applies every
edit the specification defines.  A spec is checked when one of its devices is
requested: unknown fields, a ``cdiVersion`` this runtime does not know or one
older than the fields used need, and unsupported edits fail the create, naming
the file, the device and the field.  A file that cannot be read is reported
when a device is not found.
"""

from __future__ import annotations

from . import fastjson, posixfs
from .cdiedits import Where, collect
from .edits import DeviceEdits
from .errors import CdiError

# typing costs milliseconds to import and every container create pays them
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SPEC_SUFFIXES = (".json", ".yaml", ".yml")
SPEC_FIELDS = frozenset({"cdiVersion", "kind", "annotations", "devices", "containerEdits"})
DEVICE_FIELDS = frozenset({"name", "annotations", "containerEdits"})
KNOWN_VERSIONS = ((0, 1, 0), (0, 2, 0), (0, 3, 0), (0, 4, 0), (0, 5, 0), (0, 6, 0), (0, 7, 0),
                  (0, 8, 0), (1, 0, 0), (1, 1, 0))
_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _name(value: object, first: frozenset[str], inner: str) -> bool:
    return (isinstance(value, str) and bool(value) and value[0] in first and value[-1] in _ALNUM
            and all(c in _ALNUM or c in inner for c in value))


def valid_kind(kind: object) -> bool:
    """``vendor/class``: each starts with a letter, ends alphanumeric, ``_-.`` inside."""
    vendor, slash, klass = str(kind).partition("/")
    return isinstance(kind, str) and bool(slash) and all(
        _name(part, _LETTERS, "_-.") for part in (vendor, klass))


def valid_device_name(name: object) -> bool:
    return _name(name, _ALNUM, "_-.:")


def _version(path: str, value: object) -> tuple[int, int, int]:
    text = value[1:] if isinstance(value, str) and value.startswith("v") else value
    parts = text.split(".") if isinstance(text, str) else []
    version = tuple(int(p) for p in parts if p.isdigit() and p.isascii())
    if len(version) != 3 or len(parts) != 3 or version not in KNOWN_VERSIONS:
        known = ", ".join(".".join(map(str, v)) for v in KNOWN_VERSIONS)
        raise CdiError(path, f"cdiVersion {value!r} is not one this runtime knows ({known})")
    return version  # type: ignore[return-value]


def _all_edits(doc: dict[str, Any]) -> list[dict[str, Any]]:
    devices = [d for d in doc.get("devices") or [] if isinstance(d, dict)]
    edits = [doc.get("containerEdits")] + [d.get("containerEdits") for d in devices]
    return [e for e in edits if isinstance(e, dict)]


def _uses(edits: list[dict[str, Any]], field: str, key: str) -> bool:
    return any(isinstance(item, dict) and key in item
               for e in edits for item in (e.get(field) or []) if isinstance(e.get(field), list))


def _required(doc: dict[str, Any]) -> tuple[tuple[int, int, int], str]:
    """The lowest CDI version whose fields the spec uses, and the field that needs it."""
    edits = _all_edits(doc)
    rdt = [e["intelRdt"] for e in edits if isinstance(e.get("intelRdt"), dict)]
    devices = [d for d in doc.get("devices") or [] if isinstance(d, dict)]
    checks = (
        ((1, 1, 0), "intelRdt.schemata/enableMonitoring",
         any("schemata" in r or r.get("enableMonitoring") for r in rdt)),
        ((0, 7, 0), "intelRdt/additionalGids",
         any("intelRdt" in e or e.get("additionalGids") for e in edits)),
        ((0, 6, 0), "annotations",
         bool(doc.get("annotations")) or any(d.get("annotations") for d in devices)),
        ((0, 5, 0), "deviceNodes.hostPath", _uses(edits, "deviceNodes", "hostPath")),
        ((0, 4, 0), "mounts.type", _uses(edits, "mounts", "type")),
    )
    for version, field, used in checks:
        if used:
            return version, field
    return (0, 3, 0), ""


def _annotations(path: str, where: str, notes: object) -> None:
    if notes is not None and not (isinstance(notes, dict)
                                  and all(isinstance(v, str) for v in notes.values())):
        raise CdiError(path, f"{where}annotations: expected an object of strings")


def check_spec(path: str, doc: dict[str, Any]) -> None:
    """The spec-level checks: fields, version, annotations."""
    unknown = sorted(set(doc) - SPEC_FIELDS)
    if unknown:
        raise CdiError(path, f"{unknown[0]}: not a field of the CDI specification")
    version = _version(path, doc.get("cdiVersion"))
    needed, field = _required(doc)
    if version < needed:
        raise CdiError(path, f"{field} needs cdiVersion {'.'.join(map(str, needed))} or later, "
                       f"the spec says {doc.get('cdiVersion')}")
    _annotations(path, "", doc.get("annotations"))


def _load(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as err:
        raise CdiError(path, f"cannot read: {err}") from None
    try:
        if path.endswith(".json"):
            doc = fastjson.loads(text)
        else:
            from .miniyaml import loads

            doc = loads(text)
    except ValueError as err:
        raise CdiError(path, f"not valid: {err}") from None
    if not isinstance(doc, dict) or not valid_kind(doc.get("kind")):
        raise CdiError(path, f"kind {doc.get('kind') if isinstance(doc, dict) else None!r} is not "
                       "vendor/class")
    devices = doc.get("devices")
    if not isinstance(devices, list) or not devices:
        raise CdiError(path, "devices: expected a non-empty list")
    return doc


def spec_files(directories: tuple[str, ...]) -> list[tuple[int, str]]:
    """(directory rank, path) of every spec file, earlier directories first."""
    found = []
    for rank, directory in enumerate(directories):
        try:
            names = sorted(posixfs.listdir(directory))
        except OSError:
            continue
        found += [(rank, posixfs.join(directory, n)) for n in names if n.endswith(SPEC_SUFFIXES)]
    return found


def host_device(path: str) -> dict[str, Any]:
    """An OCI ``linux.devices`` entry for the host node at ``path``; OSError if none."""
    from posix import major, minor

    info = posixfs.stat(path)
    kind = {0o020000: "c", 0o060000: "b"}.get(info.st_mode & 0o170000)
    if kind is None:
        raise OSError(f"{path} is not a device node")
    return {"path": path, "type": kind, "major": major(info.st_rdev),
            "minor": minor(info.st_rdev), "fileMode": info.st_mode & 0o7777,
            "uid": info.st_uid, "gid": info.st_gid}


class CdiRegistry:
    """Every device of every spec file, indexed once; specs checked when used."""

    def __init__(self, directories: tuple[str, ...]) -> None:
        self.devices: dict[str, tuple[int, str, dict[str, Any], dict[str, Any]]] = {}
        self.conflicts: dict[str, list[str]] = {}
        self.unreadable: list[str] = []
        self.checked: set[str] = set()
        for rank, path in spec_files(directories):
            try:
                doc = _load(path)
            except CdiError as err:
                self.unreadable.append(str(err))
                continue
            for device in doc["devices"]:
                name = device.get("name") if isinstance(device, dict) else None
                if isinstance(name, str):
                    self._add(f"{doc['kind']}={name}", (rank, path, doc, device))

    def _add(self, key: str, entry: tuple[int, str, dict[str, Any], dict[str, Any]]) -> None:
        known = self.devices.get(key)
        if known is not None and known[0] == entry[0]:
            self.conflicts.setdefault(key, [known[1]]).append(entry[1])
        elif known is None or known[0] < entry[0]:
            self.conflicts.pop(key, None)
            self.devices[key] = entry

    def resolve(self, resource: str, device_id: str, user: tuple[int, int] = (0, 0),
                seen: set[str] | None = None) -> DeviceEdits | None:
        """The edits for ``resource=device_id``, None if no spec names it.  ``seen`` holds
        the specs whose spec-level edits this create already received."""
        key = f"{resource}={device_id}"
        if key in self.conflicts:
            raise CdiError(" and ".join(self.conflicts[key]), f"device {key} is defined twice")
        entry = self.devices.get(key)
        if entry is None:
            return None
        _, path, doc, device = entry
        self._check(path, doc, device)
        edits = DeviceEdits()
        seen = set() if seen is None else seen
        if path not in seen:
            seen.add(path)
            collect(Where(path, None), doc.get("containerEdits"), user, edits)
        collect(Where(path, device_id), device.get("containerEdits"), user, edits)
        return edits

    def _check(self, path: str, doc: dict[str, Any], device: dict[str, Any]) -> None:
        if path not in self.checked:
            check_spec(path, doc)
            self.checked.add(path)
        unknown = sorted(set(device) - DEVICE_FIELDS)
        name = device.get("name")
        if unknown:
            raise CdiError(path, f"device {name!r}: {unknown[0]}: not a field of the CDI specification")
        if not valid_device_name(name):
            raise CdiError(path, f"device {name!r}: not a valid CDI device name")
        _annotations(path, f"device {name!r}: ", device.get("annotations"))
        if not isinstance(device.get("containerEdits"), dict) or not device["containerEdits"]:
            raise CdiError(path, f"device {name!r}: containerEdits: a device needs edits")
