"""The CDI spec of one prepared claim, built from the vendor table and checked strictly.

Each allocated device becomes a CDI device ``gpushare.k8s.io/gpu=<role>.<claim uid>.<card>``
whose edits are, from the vendor table (the runtime's, :mod:`gpushare_common.vendors`), the
card's device nodes (``{id}`` is the card's index; control nodes only where they exist) and,
for a ``share`` of a vendor whose ``isolation`` caps shares, that share's caps
(:mod:`gpushare_common.isolation`: N = the card's capacity, k = its shares); the spec-level
edits carry the vendor's visible-devices variables (every card of the claim) and mounts.

:func:`check_spec` is the CDI specification's schema (1.1.0) restated for the fields this
driver writes, unknown fields refused: a spec that would not load is never written.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpushare_common import dra, isolation
from gpushare_common.vendors import ID_PLACEHOLDER, VendorResource

from .claims import Allocated

Obj = dict[str, Any]
CDI_VERSION = "0.6.0"
Exists = Callable[[str], bool]  # whether a host device node (its path as the vendor table has it) exists


class CdiSpecError(ValueError):
    """A spec that breaks the CDI specification: which field and why."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"CDI spec {field}: {reason}")


def spec_file_name(claim_uid: str) -> str:
    """One file per claim, named so that the driver recognises its own."""
    return f"{dra.DRIVER}-claim-{claim_uid}.json"


def _node(path: str, device_root: str) -> Obj:
    node: Obj = {"path": path}
    if device_root:
        node["hostPath"] = device_root.rstrip("/") + path
    return node


def device_nodes(vendor: VendorResource, index: int, device_root: str, exists: Exists) -> list[Obj]:
    nodes = [_node(t.replace(ID_PLACEHOLDER, str(index)), device_root) for t in vendor.per_id_nodes]
    nodes += [_node(p, device_root) for p in vendor.control_nodes if exists(p)]
    return nodes


def _mount(mount: Mapping[str, Any]) -> Obj:
    doc: Obj = {"hostPath": mount["source"], "containerPath": mount["destination"]}
    if mount.get("options"):
        doc["options"] = list(mount["options"])
    if mount.get("type"):
        doc["type"] = mount["type"]
    return doc


Caps = Callable[[Allocated], isolation.ShareEdits | None]


def claim_spec(claim_uid: str, devices: Sequence[Allocated], vendors: Mapping[str, VendorResource],
               device_root: str, exists: Exists, caps: Caps) -> Obj:
    """The claim's CDI spec; KeyError-free: an unknown vendor is a CdiSpecError."""
    edits: list[Obj] = []
    visible: dict[str, list[str]] = {}
    mounts: list[Obj] = []
    for item in devices:
        vendor = vendors.get(item.card.vendor)
        if vendor is None:
            raise CdiSpecError("devices", f"vendor resource {item.card.vendor} is not in the vendor table")
        device: Obj = {"deviceNodes": device_nodes(vendor, item.card.index, device_root, exists)}
        capped = caps(item)
        if capped is not None:
            device["env"] = [f"{k}={v}" for k, v in sorted(capped.env.items())]
            device["mounts"] = [_mount(m) for m in capped.mounts]
        name = dra.cdi_device(item.role, claim_uid, item.card.id).name
        edits.append({"name": name, "containerEdits": {k: v for k, v in device.items() if v}})
        for variable in vendor.env:
            visible.setdefault(variable, []).append(item.card.id)
        mounts += [_mount(m) for m in vendor.mounts if _mount(m) not in mounts]
    common: Obj = {"env": [f"{k}={','.join(dict.fromkeys(v))}" for k, v in sorted(visible.items())]}
    if mounts:
        common["mounts"] = mounts
    return {"cdiVersion": CDI_VERSION, "kind": dra.CDI_KIND, "devices": edits,
            "containerEdits": {k: v for k, v in common.items() if v}}


# --- the strict check --------------------------------------------------------------------

# an annotation key as Kubernetes has it: an optional DNS-subdomain prefix and a name
_ANNOTATION_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_SPEC = {"cdiVersion", "kind", "devices", "containerEdits", "annotations"}
_EDITS = {"env", "deviceNodes", "mounts", "hooks", "additionalGids", "intelRdt", "netDevices"}
_WRITTEN_EDITS = {"env", "deviceNodes", "mounts"}
_NODE = {"path": str, "hostPath": str, "type": str, "major": int, "minor": int, "fileMode": int,
         "permissions": str, "uid": int, "gid": int}
_MOUNT = {"hostPath": str, "containerPath": str, "options": list, "type": str}


def _fields(doc: Any, allowed: Mapping[str, type] | set[str], required: Sequence[str], where: str) -> Obj:
    if not isinstance(doc, dict):
        raise CdiSpecError(where, "expected an object")
    unknown = sorted(set(doc) - set(allowed))
    if unknown:
        raise CdiSpecError(f"{where}.{unknown[0]}", "not a field of the CDI specification")
    for name in required:
        if name not in doc:
            raise CdiSpecError(f"{where}.{name}", "required")
    if isinstance(allowed, Mapping):
        for name, kind in allowed.items():
            if name in doc and (not isinstance(doc[name], kind) or isinstance(doc[name], bool)):
                raise CdiSpecError(f"{where}.{name}", f"expected {kind.__name__}")
    return doc


def _absolute(value: object, where: str) -> None:
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value or \
            any(part in (".", "..") for part in value.split("/")):
        raise CdiSpecError(where, f"{value!r} is not an absolute path without . or ..")


def _check_edits(edits: Any, where: str) -> None:
    doc = _fields(edits, _EDITS, (), where)
    unsupported = sorted(set(doc) - _WRITTEN_EDITS)
    if unsupported:
        raise CdiSpecError(f"{where}.{unsupported[0]}", "not written by this driver")
    for index, item in enumerate(doc.get("env", [])):
        name, eq, _ = item.partition("=") if isinstance(item, str) else ("", "", "")
        if not eq or not name or "\0" in item:
            raise CdiSpecError(f"{where}.env[{index}]", f"{item!r} is not NAME=value")
    for index, node in enumerate(doc.get("deviceNodes", [])):
        _fields(node, _NODE, ("path",), f"{where}.deviceNodes[{index}]")
        _absolute(node["path"], f"{where}.deviceNodes[{index}].path")
        if "hostPath" in node:
            _absolute(node["hostPath"], f"{where}.deviceNodes[{index}].hostPath")
    for index, mount in enumerate(doc.get("mounts", [])):
        _fields(mount, _MOUNT, ("hostPath", "containerPath"), f"{where}.mounts[{index}]")
        _absolute(mount["containerPath"], f"{where}.mounts[{index}].containerPath")
        if not all(isinstance(o, str) and o for o in mount.get("options", [])):
            raise CdiSpecError(f"{where}.mounts[{index}].options", "expected non-empty strings")


def check_spec(doc: Any) -> None:
    """Raise CdiSpecError unless ``doc`` is a CDI spec of this driver's kind that loads."""
    spec = _fields(doc, _SPEC, ("cdiVersion", "kind", "devices"), "spec")
    if spec["cdiVersion"] != CDI_VERSION or spec["kind"] != dra.CDI_KIND:
        raise CdiSpecError("spec", f"expected cdiVersion {CDI_VERSION} and kind {dra.CDI_KIND}")
    devices = spec["devices"]
    if not isinstance(devices, list) or not devices:
        raise CdiSpecError("spec.devices", "expected a non-empty list")
    names: set[str] = set()
    for index, device in enumerate(devices):
        item = _fields(device, {"name", "containerEdits", "annotations"}, ("name", "containerEdits"),
                       f"spec.devices[{index}]")
        name = item["name"]
        if not isinstance(name, str) or not dra.valid_cdi_name(name) or name in names:
            raise CdiSpecError(f"spec.devices[{index}].name", f"{name!r} is not a unique CDI device name")
        names.add(name)
        if not item["containerEdits"]:
            raise CdiSpecError(f"spec.devices[{index}].containerEdits", "a device needs edits")
        _check_edits(item["containerEdits"], f"spec.devices[{index}].containerEdits")
    if "containerEdits" in spec:
        _check_edits(spec["containerEdits"], "spec.containerEdits")
    annotations = spec.get("annotations", {})
    if not isinstance(annotations, dict) or not all(
            isinstance(k, str) and _ANNOTATION_KEY.fullmatch(k) and isinstance(v, str) for k, v in annotations.items()):
        raise CdiSpecError("spec.annotations", "expected an object of qualified names to strings")
