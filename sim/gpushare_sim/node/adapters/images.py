"""Container images built on the node, since no registry is reachable: a directory becomes a
one-layer OCI image archive (``oci-layout``, ``index.json``, blobs), which ``ctr images import``
stores and unpacks in containerd, where the CRI plugin finds it by name.

The layer is an uncompressed tar of the directory with every owner root and every time 0, so
the same directory always gives the same image digest.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
IMAGE_NAME = "io.containerd.image.name"  # ctr import names the image after it
REF_NAME = "org.opencontainers.image.ref.name"
_ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}


class ImageError(Exception):
    """An image could not be built or imported."""


@dataclass(frozen=True, slots=True)
class ImageSpec:
    name: str  # a full reference, e.g. gpushare.local/pause:1
    root: Path  # the directory that becomes the image's file system
    entrypoint: tuple[str, ...] = ()


def architecture() -> str:
    machine = platform.machine()
    return _ARCHITECTURES.get(machine, machine)


def _tar_info(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    return info


def layer_tar(root: Path) -> bytes:
    """The directory as a tar with stable metadata, entries in sorted order."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory, subdirs, files in os.walk(root):
            subdirs.sort()
            for name in sorted([*subdirs, *files]):
                path = Path(directory) / name
                tar.add(path, arcname=str(path.relative_to(root)), recursive=False, filter=_tar_info)
    return out.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def _json(doc: object) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def oci_archive(image: ImageSpec, target: Path) -> Path:
    """Write ``image`` as an OCI image-layout tar at ``target``; returns ``target``."""
    if not image.root.is_dir():
        raise ImageError(f"image {image.name}: {image.root} is not a directory")
    blobs: dict[str, bytes] = {}
    layer = layer_tar(image.root)
    config = {
        "architecture": architecture(), "os": "linux",
        "config": {"Entrypoint": list(image.entrypoint), "Env": ["PATH=/bin:/usr/bin"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
    }  # fmt: skip
    manifest = {
        "schemaVersion": 2, "mediaType": MANIFEST_TYPE,
        "config": _blob(blobs, _json(config), CONFIG_TYPE), "layers": [_blob(blobs, layer, LAYER_TYPE)],
    }  # fmt: skip
    tag = image.name.rsplit(":", 1)[-1] if ":" in image.name.rsplit("/", 1)[-1] else "latest"
    entry = {**_blob(blobs, _json(manifest), MANIFEST_TYPE), "annotations": {IMAGE_NAME: image.name, REF_NAME: tag},
             "platform": {"architecture": architecture(), "os": "linux"}}  # fmt: skip
    files = {"oci-layout": _json({"imageLayoutVersion": "1.0.0"}),
             "index.json": _json({"schemaVersion": 2, "manifests": [entry]}),
             **{f"blobs/sha256/{d.split(':', 1)[1]}": data for d, data in blobs.items()}}  # fmt: skip
    with tarfile.open(target, "w") as tar:
        for name, data in files.items():
            info = _tar_info(tarfile.TarInfo(name))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return target


def import_image(ctr: list[str], image: ImageSpec, work_dir: Path) -> None:
    """Build ``image`` and import it with ``ctr`` (e.g. ``ctr --address SOCK -n k8s.io``), unpacked."""
    archive = oci_archive(image, work_dir / (image.name.replace("/", "_").replace(":", "_") + ".tar"))
    try:
        done = subprocess.run([*ctr, "images", "import", str(archive)], capture_output=True, text=True,
                              timeout=120, check=False)  # fmt: skip
    except subprocess.TimeoutExpired as err:
        raise ImageError(f"image {image.name}: ctr images import did not finish in {err.timeout} s") from err
    finally:
        archive.unlink(missing_ok=True)
    if done.returncode != 0:
        raise ImageError(f"image {image.name}: ctr images import failed: {(done.stderr or done.stdout).strip()}")
