"""The spec transformation: what a container gets from another, and applying it.

Pure functions on OCI spec dictionaries.  Applying the same edits twice gives
the same spec as applying them once.  What can change: ``linux.devices``,
``linux.resources.devices``, ``process.env``, ``mounts``, and, for CDI specs
that ask for them, ``hooks``, ``process.user.additionalGids`` and
``linux.intelRdt``; nothing else.
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
HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart",
              "poststop")


class DeviceEdits:
    """What one create adds to the target spec.

    ``env`` holds visible-devices lists, merged with what the container has;
    ``fixed_env`` variables replace the container's (CDI ``env``, share caps).
    ``mounts`` are added where the container has nothing at their destination;
    ``replaced_mounts`` take the destination over (CDI ``mounts``, share caps).
    A device whose path is in ``replaced_paths`` replaces the container's node there.
    """

    __slots__ = ("devices", "env", "fixed_env", "gids", "hooks", "intel_rdt", "mounts",
                 "replaced_mounts", "replaced_paths", "rules")

    def __init__(self) -> None:
        self.devices: list[dict[str, Any]] = []
        self.rules: list[dict[str, Any]] = []
        self.env: dict[str, list[str]] = {}
        self.fixed_env: dict[str, str] = {}
        self.mounts: list[dict[str, Any]] = []
        self.replaced_mounts: list[dict[str, Any]] = []
        self.replaced_paths: set[str] = set()
        self.hooks: dict[str, list[dict[str, Any]]] = {}
        self.gids: list[int] = []
        self.intel_rdt: dict[str, Any] | None = None

    def __bool__(self) -> bool:
        return bool(self.devices or self.env or self.fixed_env or self.mounts
                    or self.replaced_mounts or self.hooks or self.gids
                    or self.intel_rdt is not None)

    def add_device(self, device: dict[str, Any], rule: dict[str, Any] | None = None,
                   replace: bool = False) -> None:
        """Add a node (and its cgroup rule: ``rule``, else full access for b/c/u nodes)."""
        self.put_device(device, replace)
        if rule is None and device.get("type", "c") in ("c", "b", "u"):
            rule = allow_rule(device)
        if rule is not None:
            self.add_rule(rule)

    def add_rule(self, rule: dict[str, Any]) -> None:
        if rule not in self.rules:
            self.rules.append(rule)

    def put_device(self, device: dict[str, Any], replace: bool = False) -> None:
        """Add a node without a cgroup rule; ``replace``: take its path over."""
        path = device.get("path")
        if replace:
            self.devices = [d for d in self.devices if d.get("path") != path]
            self.replaced_paths.add(str(path))
        if all(d.get("path") != path for d in self.devices):
            self.devices.append(device)

    def add_env(self, name: str, values: Iterable[str]) -> None:
        self.env[name] = merge_values(self.env.get(name, []), values)

    def set_env(self, name: str, value: str) -> None:
        self.fixed_env.pop(name, None)  # the last one set comes last, as in the CDI merge order
        self.fixed_env[name] = value

    def add_mount(self, mount: dict[str, Any]) -> None:
        if all(m.get("destination") != mount.get("destination") for m in self.mounts):
            self.mounts.append(mount)

    def replace_mount(self, mount: dict[str, Any]) -> None:
        destination = mount.get("destination")
        self.replaced_mounts = [m for m in self.replaced_mounts
                                if m.get("destination") != destination]
        self.replaced_mounts.append(mount)

    def add_hook(self, name: str, hook: dict[str, Any]) -> None:
        hooks = self.hooks.setdefault(name, [])
        if hook not in hooks:
            hooks.append(hook)

    def add_gid(self, gid: int) -> None:
        if gid and gid not in self.gids:
            self.gids.append(gid)

    def update(self, other: DeviceEdits) -> None:
        for device in other.devices:
            self.put_device(device, replace=device.get("path") in other.replaced_paths)
        for rule in other.rules:
            self.add_rule(rule)
        for name, values in other.env.items():
            self.add_env(name, values)
        for name, value in other.fixed_env.items():
            self.set_env(name, value)
        for mount in other.mounts:
            self.add_mount(mount)
        for mount in other.replaced_mounts:
            self.replace_mount(mount)
        for name, hooks in other.hooks.items():
            for hook in hooks:
                self.add_hook(name, hook)
        for gid in other.gids:
            self.add_gid(gid)
        if other.intel_rdt is not None:
            self.intel_rdt = other.intel_rdt


def allow_rule(device: dict[str, Any], access: str = "rwm") -> dict[str, Any]:
    kind = device.get("type", "c")
    return {
        "allow": True,
        "type": "c" if kind == "u" else kind,
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


def _apply_env(spec: Spec, edits: DeviceEdits) -> None:
    if not edits.env and not edits.fixed_env:
        return
    process = spec.setdefault("process", {})
    entries = list(_list(process, "env"))
    for name, values in edits.env.items():
        prefix = name + "="
        index = next((i for i, e in enumerate(entries) if str(e).startswith(prefix)), None)
        if index is None:
            entries.append(prefix + ",".join(values))
        else:
            current = str(entries[index])[len(prefix) :].split(",")
            entries[index] = prefix + ",".join(merge_values(current, values))
    for name, value in edits.fixed_env.items():
        prefix = name + "="
        entries = [e for e in entries if not str(e).startswith(prefix)] + [prefix + value]
    process["env"] = entries


def _depth(mount: dict[str, Any]) -> int:
    return sum(1 for part in str(mount.get("destination", "")).split("/") if part)


def _apply_mounts(spec: Spec, edits: DeviceEdits) -> None:
    """Mounts taken over keep their place; new ones follow, parents before children."""
    mounts = _list(spec, "mounts")
    replaced = {m.get("destination"): m for m in edits.replaced_mounts}
    result, placed = [], set()
    for mount in mounts:
        destination = mount.get("destination") if isinstance(mount, dict) else None
        if destination in replaced:
            if destination not in placed:
                result.append(replaced[destination])
                placed.add(destination)
            continue
        result.append(mount)
    present = {m.get("destination") for m in mounts if isinstance(m, dict)} | set(replaced)
    added = [m for m in edits.mounts if m.get("destination") not in present]
    fresh = [m for d, m in replaced.items() if d not in placed]
    result += sorted(added + fresh, key=_depth)
    if result != mounts:
        spec["mounts"] = result


def _apply_process_extras(spec: Spec, edits: DeviceEdits) -> None:
    if edits.gids:
        user = spec.setdefault("process", {}).setdefault("user", {})
        gids = list(_list(user, "additionalGids"))
        user["additionalGids"] = gids + [g for g in edits.gids if g not in gids]
    if edits.hooks:
        hooks = spec.setdefault("hooks", {})
        for name in HOOK_NAMES:
            current = list(_list(hooks, name))
            added = [h for h in edits.hooks.get(name, []) if h not in current]
            if added:
                hooks[name] = current + added


def apply_edits(spec: Spec, edits: DeviceEdits) -> Spec:
    """A new spec with ``edits`` merged in; idempotent."""
    result: Spec = fastjson.loads(fastjson.dumps(spec))  # type: ignore[assignment]
    linux = result.setdefault("linux", {})
    devices = [d for d in _list(linux, "devices")
               if not (isinstance(d, dict) and d.get("path") in edits.replaced_paths)]
    known = {d.get("path") for d in devices if isinstance(d, dict)}
    devices = devices + [d for d in edits.devices if d.get("path") not in known]
    if devices:
        linux["devices"] = devices
    if edits.rules:
        resources = linux.setdefault("resources", {})
        rules = _list(resources, "devices")
        resources["devices"] = rules + [r for r in edits.rules if r not in rules]
    if edits.intel_rdt is not None:
        linux["intelRdt"] = edits.intel_rdt
    _apply_env(result, edits)
    _apply_mounts(result, edits)
    _apply_process_extras(result, edits)
    return result
