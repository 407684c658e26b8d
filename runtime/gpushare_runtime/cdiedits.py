"""CDI ``containerEdits`` to :class:`DeviceEdits`, every edit the CDI specification defines.

- ``env``: each ``NAME=value`` is set, replacing the container's ``NAME``;
- ``deviceNodes``: a node at ``path`` (replacing one there), its type and numbers
  from the host node at ``hostPath`` (else ``path``) unless the spec gives a type
  and a major (or type ``p``); ``fileMode`` from the host when absent; ``uid`` and
  ``gid`` from the container's user when absent and not root; a cgroup rule for
  ``b``/``c`` nodes with ``permissions`` (empty: ``rwm``, ``none``: nothing);
- ``mounts``: ``hostPath`` on ``containerPath`` (replacing a mount there) with the
  spec's ``type`` and ``options`` as written (the specification defaults neither);
- ``hooks``: into the OCI ``hooks.<hookName>`` lists (``prestart``, ``createRuntime``,
  ``createContainer``, ``startContainer``, ``poststart``, ``poststop``);
- ``additionalGids``: added to ``process.user.additionalGids`` (0 is ignored);
- ``intelRdt``: ``linux.intelRdt``, the last one applied wins.

``netDevices`` (moving a host interface into the container) is refused: an
interface can be in one container only, which is not what a shared device is.
Anything else unknown is refused too, naming the file, the device and the field.
"""

from __future__ import annotations

from .edits import HOOK_NAMES, DeviceEdits, allow_rule
from .errors import CdiError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

EDIT_FIELDS = frozenset({"env", "deviceNodes", "mounts", "hooks", "additionalGids", "intelRdt",
                         "netDevices"})
NODE_FIELDS = frozenset({"path", "hostPath", "type", "major", "minor", "fileMode", "permissions",
                         "uid", "gid"})
MOUNT_FIELDS = frozenset({"hostPath", "containerPath", "type", "options"})
HOOK_FIELDS = frozenset({"hookName", "path", "args", "env", "timeout"})
RDT_FIELDS = {"closID": "l", "l3CacheSchema": "s", "memBwSchema": "s", "schemata": "v",
              "enableMonitoring": "b"}
UINT32 = 0xFFFFFFFF
INT64 = 1 << 63


class Where:
    """Which file, device and field an error is about."""

    __slots__ = ("device", "path")

    def __init__(self, path: str, device: str | None) -> None:
        self.path = path
        self.device = device

    def error(self, field: str, reason: str) -> CdiError:
        scope = f"device {self.device!r}" if self.device is not None else "spec-level"
        return CdiError(self.path, f"{scope} containerEdits{'.' * bool(field)}{field}: {reason}")


def _object(where: Where, field: str, value: object, allowed: frozenset[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise where.error(field, "expected an object")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise where.error(f"{field}.{unknown[0]}" if field else unknown[0],
                          "not a field of the CDI specification")
    return value


def _list(where: Where, field: str, value: object) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise where.error(field, "expected a list")
    return value


def _strings(where: Where, field: str, value: object) -> list[str]:
    items = _list(where, field, value)
    if not all(isinstance(item, str) for item in items):
        raise where.error(field, "expected a list of strings")
    return items


def _env(where: Where, field: str, value: object) -> list[str]:
    entries = _strings(where, field, value)
    for entry in entries:
        if entry.find("=") <= 0:
            raise where.error(field, f"{entry!r} is not NAME=value")
    return entries


def _int(where: Where, field: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise where.error(field, f"expected an integer in [{low}, {high}], got {value!r}")
    return value


def _text(where: Where, field: str, value: object, required: bool = False) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise where.error(field, "expected a non-empty string" if required else "expected a string")
    return value


def _stat_node(where: Where, field: str, host: str) -> tuple[str, int, int, int] | None:
    """(type, major, minor, mode) of the host node at ``host`` (not followed if a link);
    None if nothing is there."""
    from posix import lstat, major, minor

    try:
        info = lstat(host)
    except OSError:
        return None
    kind = {0o020000: "c", 0o060000: "b", 0o010000: "p"}.get(info.st_mode & 0o170000)
    if kind is None:
        raise where.error(field, f"host path {host} is not a device node")
    return kind, major(info.st_rdev), minor(info.st_rdev), info.st_mode & 0o7777


def _node_numbers(where: Where, field: str, node: dict[str, Any]) -> dict[str, Any]:
    path = _text(where, f"{field}.path", node.get("path"), required=True)
    host = _text(where, f"{field}.hostPath", node.get("hostPath")) or path
    kind = _text(where, f"{field}.type", node.get("type"))
    if kind not in ("", "b", "c", "u", "p"):
        raise where.error(f"{field}.type", f"expected b, c, u or p, got {kind!r}")
    major = _int(where, f"{field}.major", node.get("major", 0), -INT64, INT64 - 1)
    minor = _int(where, f"{field}.minor", node.get("minor", 0), -INT64, INT64 - 1)
    entry: dict[str, Any] = {"path": path, "type": kind, "major": major, "minor": minor}
    minimal = kind != "" and (major != 0 or kind == "p")
    found = _stat_node(where, field, host)
    if found is None:
        if not minimal:
            raise where.error(field, f"host device {host} does not exist (and the spec does not "
                              "give its type and major)")
        return entry
    entry["fileMode"] = found[3]
    if minimal:
        return entry
    if kind and kind != found[0]:
        raise where.error(f"{field}.type", f"{kind!r} but the host node {host} is {found[0]!r}")
    entry["type"] = kind or found[0]
    if entry["type"] != "p" and major == 0:
        entry["major"], entry["minor"] = found[1], found[2]
    return entry


def _device_node(where: Where, field: str, value: object, user: tuple[int, int],
                 out: DeviceEdits) -> None:
    node = _object(where, field, value, NODE_FIELDS)
    entry = _node_numbers(where, field, node)
    if "fileMode" in node:
        entry["fileMode"] = _int(where, f"{field}.fileMode", node["fileMode"], 0, UINT32)
    for key, default in (("uid", user[0]), ("gid", user[1])):
        if key in node:
            entry[key] = _int(where, f"{field}.{key}", node[key], 0, UINT32)
        elif default > 0:
            entry[key] = default
    permissions = _text(where, f"{field}.permissions", node.get("permissions"))
    if permissions != "none" and permissions.strip("rwm"):
        raise where.error(f"{field}.permissions", f"expected r, w, m or 'none', got {permissions!r}")
    access = {"": "rwm", "none": ""}.get(permissions, permissions)
    out.put_device(entry, replace=True)
    if entry["type"] in ("b", "c"):
        out.add_rule(allow_rule(entry, access))


def _mount(where: Where, field: str, value: object, out: DeviceEdits) -> None:
    mount = _object(where, field, value, MOUNT_FIELDS)
    entry: dict[str, Any] = {
        "destination": _text(where, f"{field}.containerPath", mount.get("containerPath"), True),
        "source": _text(where, f"{field}.hostPath", mount.get("hostPath"), True),
    }
    if mount.get("type") is not None:
        entry["type"] = _text(where, f"{field}.type", mount["type"])
    if mount.get("options") is not None:
        entry["options"] = _strings(where, f"{field}.options", mount["options"])
    out.replace_mount(entry)


def _hook(where: Where, field: str, value: object, out: DeviceEdits) -> None:
    hook = _object(where, field, value, HOOK_FIELDS)
    name = hook.get("hookName")
    if name not in HOOK_NAMES:
        raise where.error(f"{field}.hookName", f"expected one of {', '.join(HOOK_NAMES)}, got {name!r}")
    path = _text(where, f"{field}.path", hook.get("path"), required=True)
    if not path.startswith("/"):
        raise where.error(f"{field}.path", f"must be absolute, got {path!r}")
    entry: dict[str, Any] = {"path": path}
    if hook.get("args") is not None:
        entry["args"] = _strings(where, f"{field}.args", hook["args"])
    if hook.get("env") is not None:
        entry["env"] = _env(where, f"{field}.env", hook["env"])
    if hook.get("timeout") is not None:
        entry["timeout"] = _int(where, f"{field}.timeout", hook["timeout"], 1, 2**31 - 1)
    out.add_hook(str(name), entry)


def _intel_rdt(where: Where, value: object) -> dict[str, Any]:
    rdt = _object(where, "intelRdt", value, frozenset(RDT_FIELDS))
    result: dict[str, Any] = {}
    for key, kind in RDT_FIELDS.items():
        item = rdt.get(key)
        if item is None or item is False:
            continue
        field = f"intelRdt.{key}"
        if kind == "b" and item is not True:
            raise where.error(field, "expected true or false")
        if kind == "v":
            item = _strings(where, field, item)
        elif kind in "sl":
            item = _text(where, field, item)
        if kind == "l" and item != "/" and (item in (".", "..") or "/" in item or "\n" in item
                                            or len(item) >= 4096):
            raise where.error(field, f"{item!r} is not a valid class of service name")
        result[key] = item
    return result


def collect(where: Where, value: object, user: tuple[int, int], out: DeviceEdits) -> None:
    """Validate one ``containerEdits`` object and add what it asks for to ``out``."""
    if value is None:
        return
    edits = _object(where, "", value, EDIT_FIELDS)
    if edits.get("netDevices"):
        raise where.error("netDevices", "not supported: a host network interface can be moved "
                          "into one container only, and gpushare shares devices")
    for entry in _env(where, "env", edits.get("env")):
        name, _, text = entry.partition("=")
        out.set_env(name, text)
    for index, node in enumerate(_list(where, "deviceNodes", edits.get("deviceNodes"))):
        _device_node(where, f"deviceNodes[{index}]", node, user, out)
    for index, mount in enumerate(_list(where, "mounts", edits.get("mounts"))):
        _mount(where, f"mounts[{index}]", mount, out)
    for index, hook in enumerate(_list(where, "hooks", edits.get("hooks"))):
        _hook(where, f"hooks[{index}]", hook, out)
    if edits.get("intelRdt") is not None:
        out.intel_rdt = _intel_rdt(where, edits["intelRdt"])
    for index, gid in enumerate(_list(where, "additionalGids", edits.get("additionalGids"))):
        out.add_gid(_int(where, f"additionalGids[{index}]", gid, 0, UINT32))
