"""CDI spec fixtures in the shapes of the CDI project's examples and of `nvidia-ctk cdi generate`.

``CDI_SCHEMA`` restates, as a JSON schema, the constraints the CDI specification
(1.1.0) and its schema put on a spec file, with unknown fields refused as the
reference loader refuses them; the fixtures are checked against it so that they
are CDI specs, not just things our reader accepts.  Host device nodes live under
a temporary "driver root" (``hostPath``), as the generator writes them when the
driver is not installed at ``/``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

UINT32 = {"type": "integer", "minimum": 0, "maximum": 4294967295}
INT64 = {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
STRINGS = {"type": "array", "items": {"type": "string"}}
ANNOTATIONS = {"type": "object", "additionalProperties": {"type": "string"}}


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False}


EDITS = _object({
    "env": STRINGS,
    "deviceNodes": {"type": "array", "items": _object({
        "path": {"type": "string"}, "hostPath": {"type": "string"}, "type": {"type": "string"},
        "major": INT64, "minor": INT64, "fileMode": UINT32, "permissions": {"type": "string"},
        "uid": UINT32, "gid": UINT32}, ("path",))},
    "mounts": {"type": "array", "items": _object({
        "hostPath": {"type": "string"}, "containerPath": {"type": "string"},
        "options": STRINGS, "type": {"type": "string"}}, ("hostPath", "containerPath"))},
    "hooks": {"type": "array", "items": _object({
        "hookName": {"type": "string"}, "path": {"type": "string"}, "args": STRINGS,
        "env": STRINGS, "timeout": UINT32}, ("hookName", "path"))},
    "netDevices": {"type": "array", "items": _object({
        "hostInterfaceName": {"type": "string"}, "name": {"type": "string"}},
        ("hostInterfaceName", "name"))},
    "intelRdt": _object({"closID": {"type": "string"}, "l3CacheSchema": {"type": "string"},
                         "memBwSchema": {"type": "string"}, "schemata": STRINGS,
                         "enableMonitoring": {"type": "boolean"}}),
    "additionalGids": {"type": "array", "items": UINT32},
})
CDI_SCHEMA = _object({
    "cdiVersion": {"type": "string"},
    "kind": {"type": "string"},
    "annotations": ANNOTATIONS,
    "devices": {"type": "array", "minItems": 1, "items": _object({
        "name": {"type": "string"}, "annotations": ANNOTATIONS, "containerEdits": EDITS},
        ("name", "containerEdits"))},
    "containerEdits": EDITS,
}, ("cdiVersion", "kind", "devices"))


def host_nodes(root: Path, nodes: dict[str, tuple[int, int]]) -> Path:
    """Character nodes ``root/dev/...`` with the given numbers (needs root)."""
    for name, (major, minor) in nodes.items():
        path = root / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(path, 0o660 | stat.S_IFCHR, os.makedev(major, minor))
        os.chmod(path, 0o660)  # whatever the umask
    return root


def spec_example(root: Path) -> dict[str, Any]:
    """The shape of the CDI project's schema/testdata/good/spec-example.json."""
    return {
        "cdiVersion": "0.6.0",
        "kind": "vendor.com/device",
        "devices": [{"name": "myDevice", "containerEdits": {"deviceNodes": [
            {"hostPath": f"{root}/dev/card1", "path": "/dev/card1"},
            {"path": "/dev/card2", "type": "c", "major": 240, "minor": 2}]}}],
        "containerEdits": {
            "env": ["FOO=CDI_SPEC", "BAR=BARVALUE1"],
            "deviceNodes": [{"path": "/dev/vendorctl", "hostPath": f"{root}/dev/vendorctl",
                             "uid": 1000, "gid": 1000}],
            "mounts": [{"hostPath": "/bin/vendorBin", "containerPath": "/bin/vendorBin"},
                       {"hostPath": "/usr/lib/libVendor.so.0",
                        "containerPath": "/usr/lib/libVendor.so.0"}],
            "hooks": [{"hookName": "createContainer", "path": "/bin/vendor-hook"},
                      {"hookName": "startContainer", "path": "/usr/bin/ldconfig"}],
        },
    }


def minimal() -> dict[str, Any]:
    """The shape of schema/testdata/good/minimal.json."""
    return {"cdiVersion": "0.3.0", "kind": "vendor.com/device",
            "devices": [{"name": "dev1", "containerEdits": {"env": ["MINIMAL=1"]}}]}


def resctrl_and_gids() -> dict[str, Any]:
    """0.7.0 fields (intelRdt, additionalGids) and 1.1.0 ones (schemata, enableMonitoring)."""
    return {
        "cdiVersion": "1.1.0", "kind": "vendor.com/rdt",
        "annotations": {"vendor.com/note": "example"},
        "devices": [{"name": "0", "annotations": {"vendor.com/slot": "0"}, "containerEdits": {
            "additionalGids": [0, 44, 44, 107],
            "intelRdt": {"closID": "gpushare", "l3CacheSchema": "L3:0=f", "schemata": ["MB:0=50"],
                         "enableMonitoring": True}}}],
        "containerEdits": {"additionalGids": [44], "intelRdt": {"closID": "spec-level"}},
    }


NVIDIA_NODES = {"/dev/nvidia0": (195, 0), "/dev/nvidia1": (195, 1), "/dev/nvidiactl": (195, 255),
                "/dev/nvidia-uvm": (511, 0), "/dev/nvidia-uvm-tools": (511, 1),
                "/dev/dri/card1": (226, 1), "/dev/dri/renderD128": (226, 128)}
DRIVER = "550.54.15"
LIBS = "/usr/lib/x86_64-linux-gnu"


def nvidia_yaml(root: Path) -> str:
    """What `nvidia-ctk cdi generate --driver-root ROOT` writes: control nodes, driver library
    mounts and createContainer hooks for every device, the card's own nodes per device."""
    mounts = "".join(
        f"  - containerPath: {LIBS}/{lib}.so.{DRIVER}\n    hostPath: {root}{LIBS}/{lib}.so.{DRIVER}\n"
        "    options:\n    - ro\n    - nosuid\n    - nodev\n    - bind\n"
        for lib in ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler"))
    nodes = "".join(f"  - hostPath: {root}{p}\n    path: {p}\n" for p in
                    ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"))
    device = "".join(
        f"- containerEdits:\n    deviceNodes:\n    - hostPath: {root}/dev/nvidia{i}\n"
        f"      path: /dev/nvidia{i}\n" + (
            f"    - hostPath: {root}/dev/dri/card1\n      path: /dev/dri/card1\n"
            f"    - hostPath: {root}/dev/dri/renderD128\n      path: /dev/dri/renderD128\n"
            "    hooks:\n    - args:\n      - nvidia-cdi-hook\n      - create-symlinks\n"
            "      - --link\n      - ../card1::/dev/dri/by-path/pci-0000:3b:00.0-card\n"
            "      hookName: createContainer\n      path: /usr/bin/nvidia-cdi-hook\n"
            if i == 0 else "") + f"  name: \"{i}\"\n" for i in (0, 1))
    return (
        "---\ncdiVersion: 0.5.0\ncontainerEdits:\n  deviceNodes:\n" + nodes
        + "  env:\n  - NVIDIA_VISIBLE_DEVICES=void\n  hooks:\n"
        "  - args:\n    - nvidia-cdi-hook\n    - create-symlinks\n    - --link\n"
        f"    - libcuda.so.1::{LIBS}/libcuda.so\n    hookName: createContainer\n"
        "    path: /usr/bin/nvidia-cdi-hook\n"
        "  - args:\n    - nvidia-cdi-hook\n    - update-ldcache\n    - --folder\n"
        f"    - {LIBS}\n    hookName: createContainer\n    path: /usr/bin/nvidia-cdi-hook\n"
        "  mounts:\n" + mounts + "devices:\n" + device + "kind: nvidia.com/gpu\n"
    )
