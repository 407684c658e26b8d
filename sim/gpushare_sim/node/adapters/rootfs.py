"""Container root filesystems: a busybox-static base (one copy per node, with
applet symlinks and the workload program), hard-linked per container."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


class RootfsError(Exception):
    """The base root filesystem could not be built."""


def find_busybox(candidates: tuple[str, ...] = ("busybox",)) -> Path:
    for name in candidates:
        found = shutil.which(name) or shutil.which(name, path="/bin:/usr/bin:/sbin:/usr/sbin")
        if found:
            return Path(found)
    raise RootfsError("busybox not found on PATH (install busybox-static)")


def _applets(busybox: Path) -> list[str]:
    out = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RootfsError(f"{busybox} --list failed: {out.stderr.strip()}")
    return [a for a in out.stdout.split() if a and "/" not in a]


def build_base(base: Path, busybox: Path, extra_bins: list[Path]) -> Path:
    """Create (idempotently) ``base`` with /bin/busybox, its applets and ``extra_bins``."""
    marker = base / ".complete"
    if marker.exists():
        return base
    bin_dir = base / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox, bin_dir / "busybox")
    for applet in _applets(busybox):
        link = bin_dir / applet
        if not link.exists() and not link.is_symlink():
            link.symlink_to("busybox")
    for binary in extra_bins:
        (bin_dir / binary.name).unlink(missing_ok=True)
        shutil.copy2(binary, bin_dir / binary.name)
    for sub in ("proc", "sys", "dev", "tmp", "run", "etc", "usr/bin"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    (base / "etc" / "passwd").write_text("root:x:0:0:root:/:/bin/sh\n")
    marker.touch()
    return base


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def container_rootfs(base: Path, target: Path) -> Path:
    """A private root for one container: the base, hard-linked."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(base, target, symlinks=True, copy_function=_link_or_copy)
    return target
