"""Spec, bundle and key builders shared by the runtime tests."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from gpushare_common import ids

CRI_NAMESPACE = "io.kubernetes.cri.sandbox-namespace"
CRI_POD = "io.kubernetes.cri.sandbox-name"
CRI_CONTAINER = "io.kubernetes.cri.container-name"
# /dev/null's numbers stand in for a GPU: runc always allows them in the device cgroup
NULL_MAJOR, NULL_MINOR = 1, 3
# /dev/kmsg's numbers: not allowed unless the spec says so, so they prove the cgroup rule
KMSG_MAJOR, KMSG_MINOR = 1, 11


@cache
def _runc_default_spec() -> str:
    with tempfile.TemporaryDirectory() as bundle:
        subprocess.run(["runc", "spec", "--bundle", bundle], check=True)
        return Path(bundle, "config.json").read_text()


def identity(namespace: str, pod: str, container: str) -> dict[str, str]:
    return {CRI_NAMESPACE: namespace, CRI_POD: pod, CRI_CONTAINER: container}


def gpu_device(path: str = "/dev/nvidia0", major: int = 195, minor: int = 0) -> dict[str, Any]:
    return {"path": path, "type": "c", "major": major, "minor": minor,
            "fileMode": 0o666, "uid": 0, "gid": 0}


def allow(major: int, minor: int) -> dict[str, Any]:
    return {"allow": True, "type": "c", "major": major, "minor": minor, "access": "rwm"}


def spec(
    annotations: dict[str, str] | None = None,
    devices: list[dict[str, Any]] | None = None,
    env: list[str] | None = None,
    args: list[str] | None = None,
    rootfs: Path | None = None,
) -> dict[str, Any]:
    """runc's default spec with the given pieces; devices get their allow rules."""
    result: dict[str, Any] = json.loads(_runc_default_spec())
    result["process"]["terminal"] = False
    result["process"]["args"] = args or ["true"]
    result["process"]["env"] += env or []
    if rootfs is not None:
        result["root"] = {"path": str(rootfs), "readonly": True}
    result["annotations"] = dict(annotations or {})
    for device in devices or []:
        result["linux"].setdefault("devices", []).append(copy.deepcopy(device))
        rules = result["linux"]["resources"]["devices"]
        rules.append(allow(device["major"], device["minor"]))
    return result


def write_bundle(directory: Path, content: dict[str, Any], mode: int = 0o640) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    path.write_text(json.dumps(content, indent=1))
    os.chmod(path, mode)
    return directory


def read_spec(bundle: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((bundle / "config.json").read_text())
    return result


def write_key(path: Path) -> bytes:
    key = os.urandom(32).hex().encode()
    path.write_bytes(key)
    os.chmod(path, 0o600)
    return key


NODE = "node-test"
PREFIXES = {ids.KIND_FROM: ids.ANN_DEVICES_FROM, ids.KIND_IDS: ids.ANN_DEVICES_IDS,
            ids.KIND_ISOLATION: ids.ANN_DEVICES_ISOLATION}


def signed(key: bytes, target: str, kind: str, value: str, node: str = NODE) -> dict[str, str]:
    """The annotation and its v2 signature for ``target`` on ``node``."""
    return {PREFIXES[kind] + target: value,
            ids.signature_annotation(kind, target): ids.sign(key, kind, node, target, value)}


def write_config(path: Path, **fields: Any) -> Path:
    """A runtime configuration; its bundle index lives beside it unless given."""
    fields.setdefault("index_dir", str(path.parent / "index"))
    fields.setdefault("node_name", NODE)
    path.write_text(json.dumps(fields, indent=1))
    return path
