"""The spec transformation: what a container gets from another, and applying it.

Pure functions on OCI spec dictionaries.  Applying the same edits twice gives
the same spec as applying them once; nothing outside ``linux.devices``,
``linux.resources.devices``, ``process.env`` and ``mounts`` ever changes.
"""

from __future__ import annotations

from . import fastjson
from .config import VendorResource

# typing costs milliseconds to import and every container create pays them
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    Spec = dict[str, Any]
EMPTY_VALUES = frozenset({"", "void", "none"})


class DeviceEdits:
    """Devices, their cgroup allow rules, visible-devices values and mounts to add."""

    __slots__ = ("devices", "env", "mounts", "rules")

    def __init__(self) -> None:
        self.devices: list[dict[str, Any]] = []
        self.rules: list[dict[str, Any]] = []
        self.env: dict[str, list[str]] = {}
        self.mounts: list[dict[str, Any]] = []

    def __bool__(self) -> bool:
        return bool(self.devices or self.env or self.mounts)

    def add_device(self, device: dict[str, Any], rule: dict[str, Any] | None = None) -> None:
        if all(d.get("path") != device.get("path") for d in self.devices):
            self.devices.append(device)
        rule = rule or allow_rule(device)
        if rule not in self.rules:
            self.rules.append(rule)

    def add_env(self, name: str, values: Iterable[str]) -> None:
        self.env[name] = merge_values(self.env.get(name, []), values)

    def add_mount(self, mount: dict[str, Any]) -> None:
        if all(m.get("destination") != mount.get("destination") for m in self.mounts):
            self.mounts.append(mount)

    def update(self, other: DeviceEdits) -> None:
        known = {d.get("path") for d in self.devices}
        self.devices.extend(d for d in other.devices if d.get("path") not in known)
        for rule in other.rules:
            if rule not in self.rules:
                self.rules.append(rule)
        for name, values in other.env.items():
            self.add_env(name, values)
        for mount in other.mounts:
            self.add_mount(mount)


def allow_rule(device: dict[str, Any], access: str = "rwm") -> dict[str, Any]:
    return {
        "allow": True,
        "type": device.get("type", "c"),
        "major": device.get("major"),
        "minor": device.get("minor"),
        "access": access,
    }


def merge_values(current: Iterable[str], added: Iterable[str]) -> list[str]:
    """Comma-list union in order; ``all`` wins, ``void``/``none`` give way to real devices."""
    merged: list[str] = []
    for value in (*current, *added):
        if value not in EMPTY_VALUES and value not in merged:
            merged.append(value)
    return ["all"] if "all" in merged else merged


def split_env(entries: Iterable[object]) -> dict[str, str]:
    found: dict[str, str] = {}
    for entry in entries:
        if isinstance(entry, str) and "=" in entry:
            name, _, value = entry.partition("=")
            found[name] = value
    return found


def _linux(spec: Spec) -> dict[str, Any]:
    linux = spec.get("linux")
    return linux if isinstance(linux, dict) else {}


def _list(container: dict[str, Any], key: str) -> list[Any]:
    value = container.get(key)
    return value if isinstance(value, list) else []


def _matching_rule(rules: list[Any], device: dict[str, Any]) -> dict[str, Any] | None:
    for rule in rules:
        if (
            isinstance(rule, dict)
            and rule.get("allow") is True
            and rule.get("type", "a") in (device.get("type"), "a")
            and rule.get("major") == device.get("major")
            and rule.get("minor") == device.get("minor")
        ):
            return rule
    return None


def _selected(path: str, vendors: list[VendorResource] | None) -> bool:
    return vendors is None or any(v.owns_path(path) for v in vendors)


def edits_from_source(
    source: Spec, vendors: list[VendorResource] | None, visible_env: Iterable[str]
) -> DeviceEdits:
    """What to copy from ``source``: every device (``vendors`` None) or those vendors' devices.

    ``visible_env`` names the variables to merge when copying every device.
    """
    edits = DeviceEdits()
    linux = _linux(source)
    rules = _list(linux.get("resources") or {}, "devices")
    for device in _list(linux, "devices"):
        if isinstance(device, dict) and _selected(str(device.get("path")), vendors):
            edits.add_device(device, _matching_rule(rules, device))
    names = set(visible_env) if vendors is None else {n for v in vendors for n in v.env}
    env = split_env(_list(source.get("process") or {}, "env"))
    for name in sorted(names & env.keys()):
        values = merge_values([], env[name].split(","))
        if values:
            edits.add_env(name, values)
    wanted = {m["destination"] for v in (vendors or []) for m in v.mounts}
    for mount in _list(source, "mounts"):
        if isinstance(mount, dict) and mount.get("destination") in wanted:
            edits.add_mount(mount)
    return edits


def _apply_env(spec: Spec, env_edits: dict[str, list[str]]) -> None:
    if not env_edits:
        return
    process = spec.setdefault("process", {})
    entries = list(_list(process, "env"))
    for name, values in env_edits.items():
        prefix = name + "="
        index = next((i for i, e in enumerate(entries) if str(e).startswith(prefix)), None)
        if index is None:
            entries.append(prefix + ",".join(values))
        else:
            current = str(entries[index])[len(prefix) :].split(",")
            entries[index] = prefix + ",".join(merge_values(current, values))
    process["env"] = entries


def apply_edits(spec: Spec, edits: DeviceEdits) -> Spec:
    """A new spec with ``edits`` merged in; idempotent."""
    result: Spec = fastjson.loads(fastjson.dumps(spec))  # type: ignore[assignment]
    linux = result.setdefault("linux", {})
    devices = _list(linux, "devices")
    known = {d.get("path") for d in devices if isinstance(d, dict)}
    devices = devices + [d for d in edits.devices if d.get("path") not in known]
    if devices:
        linux["devices"] = devices
    if edits.rules:
        resources = linux.setdefault("resources", {})
        rules = _list(resources, "devices")
        resources["devices"] = rules + [r for r in edits.rules if r not in rules]
    _apply_env(result, edits.env)
    mounts = _list(result, "mounts")
    targets = {m.get("destination") for m in mounts if isinstance(m, dict)}
    added = [m for m in edits.mounts if m.get("destination") not in targets]
    if added:
        result["mounts"] = mounts + added
    return result
