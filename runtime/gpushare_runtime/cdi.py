"""Container Device Interface specs: ``<kind>=<name>`` to container edits.

Spec files (``*.json``, ``*.yaml``, ``*.yml``) in the configured directories,
later directories overriding earlier ones as the CDI specification says.
Only ``containerEdits`` (``deviceNodes``, ``env``, ``mounts``) of the device and
of the spec are used; a device node without major/minor is looked up on the
host.
"""

from __future__ import annotations

import os
import stat

from . import fastjson
from .edits import DeviceEdits, split_env
from .errors import CdiError

# typing costs milliseconds to import and every container create pays them
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SPEC_SUFFIXES = (".json", ".yaml", ".yml")
_TYPES = {stat.S_IFCHR: "c", stat.S_IFBLK: "b"}


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
    if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
        raise CdiError(path, "needs a 'kind'")
    return doc


def _items(path: str, owner: dict[str, Any], field: str) -> list[Any]:
    value = owner.get(field)
    if value is None:
        return []
    if not isinstance(value, list):
        raise CdiError(path, f"{field} must be a list")
    return value


def spec_files(directories: tuple[str, ...]) -> list[str]:
    found = []
    for directory in directories:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        found += [os.path.join(directory, n) for n in names if n.endswith(SPEC_SUFFIXES)]
    return found


def host_device(path: str) -> dict[str, Any]:
    """An OCI ``linux.devices`` entry for the host node at ``path``; OSError if none."""
    info = os.stat(path)
    kind = _TYPES.get(stat.S_IFMT(info.st_mode))
    if kind is None:
        raise OSError(f"{path} is not a device node")
    return {
        "path": path,
        "type": kind,
        "major": os.major(info.st_rdev),
        "minor": os.minor(info.st_rdev),
        "fileMode": stat.S_IMODE(info.st_mode),
        "uid": info.st_uid,
        "gid": info.st_gid,
    }


class CdiRegistry:
    """Every device of every spec file, read once."""

    def __init__(self, directories: tuple[str, ...]) -> None:
        self.devices: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {}
        for path in spec_files(directories):
            doc = _load(path)
            common = doc.get("containerEdits") or {}
            for device in _items(path, doc, "devices"):
                if isinstance(device, dict) and isinstance(device.get("name"), str):
                    edits = device.get("containerEdits") or {}
                    self.devices[f"{doc['kind']}={device['name']}"] = (path, edits, common)

    def resolve(self, resource: str, device_id: str) -> DeviceEdits | None:
        """The edits for ``resource=device_id``, None if no spec names it."""
        entry = self.devices.get(f"{resource}={device_id}")
        if entry is None:
            return None
        path, own, common = entry
        edits = DeviceEdits()
        for container_edits in (own, common):
            _collect(path, container_edits, edits)
        return edits


def _device_entry(path: str, node: dict[str, Any]) -> dict[str, Any]:
    container_path = node.get("path")
    host_path = node.get("hostPath") or container_path
    if not isinstance(container_path, str) or not isinstance(host_path, str):
        raise CdiError(path, f"deviceNode needs string path/hostPath: {node!r}")
    if node.get("type", "c") not in ("c", "b", "u", "p"):
        raise CdiError(path, f"deviceNode {container_path}: bad type {node.get('type')!r}")
    if isinstance(node.get("major"), int) and isinstance(node.get("minor"), int):
        entry = {"path": container_path, "type": node.get("type", "c"),
                 "major": node["major"], "minor": node["minor"]}
    else:
        try:
            entry = host_device(host_path)
        except OSError as err:
            raise CdiError(path, f"device node {container_path}: {err}") from None
        entry["path"] = container_path
    for key in ("fileMode", "uid", "gid"):
        if key in node:
            entry[key] = node[key]
    return entry


def _collect(path: str, container_edits: object, edits: DeviceEdits) -> None:
    if not isinstance(container_edits, dict):
        raise CdiError(path, "containerEdits must be a mapping")
    for node in _items(path, container_edits, "deviceNodes"):
        if not isinstance(node, dict):
            raise CdiError(path, f"bad deviceNode {node!r}")
        entry = _device_entry(path, node)
        edits.add_device(entry, None)
    for name, value in split_env(_items(path, container_edits, "env")).items():
        edits.add_env(name, value.split(","))
    for mount in _items(path, container_edits, "mounts"):
        if not isinstance(mount, dict) or not mount.get("containerPath"):
            raise CdiError(path, f"bad mount {mount!r}")
        edits.add_mount({
            "source": mount.get("hostPath"),
            "destination": mount["containerPath"],
            "type": mount.get("type", "bind"),
            "options": mount.get("options", ["ro", "nosuid", "nodev", "bind"]),
        })
