"""gpushare-runtime as the runc binary of a real containerd (``ctr run --runc-binary``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from gpushare_common import ids
from gpushare_sim.containerd import Containerd, ContainerdError

from tests.support.kubelet import Kubelet

from .builders import NULL_MAJOR, NULL_MINOR, identity, signed, write_config, write_key
from .conftest import make_rootfs

pytestmark = pytest.mark.containerd


@pytest.fixture
def card(tmp_path: Path) -> Path:
    """A character node with /dev/null's numbers standing in for nvidia0."""
    node = tmp_path / "dev" / "nvidia0"
    node.parent.mkdir()
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(NULL_MAJOR, NULL_MINOR))
    return node


@pytest.fixture
def box_rootfs(tmp_path: Path) -> Path:
    """The source's root filesystem: runc creates the node's path inside it."""
    return make_rootfs(tmp_path / "rootfs-source")


def probe(card: Path) -> tuple[str, ...]:
    return ("/bin/sh", "-c", f"stat -c %t:%T {card} && echo gpushare > {card} && echo written")


def start_source(ctrd: Containerd, rootfs: Path, runtime_bin: Path, card: Path,
                 namespace: str, pod: str) -> None:
    ctrd.run(rootfs, "source", "/bin/sleep", "60", runc_binary=str(runtime_bin), detach=True,
             annotations=identity(namespace, pod, "main"), devices=[str(card)])


def run_target(ctrd: Containerd, rootfs: Path, runtime_bin: Path, card: Path,
               annotations: dict[str, str], name: str = "target") -> str:
    """Run the probe in a container with a root filesystem of its own (beside the source's)."""
    rootfs = make_rootfs(rootfs.parent / f"rootfs-{name}")
    result = ctrd.run(rootfs, name, *probe(card), runc_binary=str(runtime_bin),
                      annotations={**identity("ns1", "pod1", "dind"), **annotations})
    return result.stdout


def test_same_pod_copy(containerd: Containerd, box_rootfs: Path, runtime_bin: Path,
                       card: Path) -> None:
    start_source(containerd, box_rootfs, runtime_bin, card, "ns1", "pod1")
    out = run_target(containerd, box_rootfs, runtime_bin, card,
                     {ids.ANN_DEVICES_FROM + "dind": "_/_/main"})
    assert out.split() == [f"{NULL_MAJOR:x}:{NULL_MINOR:x}", "written"]


def test_control_without_annotation(containerd: Containerd, box_rootfs: Path,
                                    runtime_bin: Path, card: Path) -> None:
    start_source(containerd, box_rootfs, runtime_bin, card, "ns1", "pod1")
    with pytest.raises(ContainerdError) as caught:
        run_target(containerd, box_rootfs, runtime_bin, card, {}, name="control")
    assert "written" not in caught.value.detail


def test_signed_cross_pod_works_unsigned_fails(containerd: Containerd, box_rootfs: Path,
                                               runtime_bin: Path, card: Path,
                                               tmp_path: Path, kubelet: Kubelet) -> None:
    key = write_key(tmp_path / "signing.key")
    write_config(tmp_path / "runtime.json", key_file=str(tmp_path / "signing.key"),
                 pod_resources_socket=str(kubelet.socket))
    start_source(containerd, box_rootfs, runtime_bin, card, "gpushare-system", "shadow-1")
    reference = "gpushare-system/shadow-1/main"
    value = ids.format_devices_from({reference: {"*": ["gpushare-system/shadow-1-0"]}})
    kubelet.allocate("ns1/pod1", "dind", "gpushare/share-gpu-2", ["gpushare-system/shadow-1-0"])
    out = run_target(containerd, box_rootfs, runtime_bin, card, signed(key, "*", "from", value))
    assert "written" in out
    with pytest.raises(ContainerdError) as caught:
        run_target(containerd, box_rootfs, runtime_bin, card,
                   {ids.ANN_DEVICES_FROM + "*": reference}, name="unsigned")
    message = str(caught.value)
    assert ids.ANN_DEVICES_FROM + "*" in message and reference in message
    assert "signature-from.* is missing" in message


def test_stop_leaves_nothing_behind(box_rootfs: Path) -> None:
    ctrd = Containerd()
    ctrd.start()
    ctrd.run(box_rootfs, "sleeper", "/bin/sleep", "60", detach=True)
    assert "RUNNING" in ctrd.ctr("task", "ls").stdout
    base, address = ctrd.base_dir, str(ctrd.address).encode()
    ctrd.stop()
    ctrd.stop()
    assert not base.exists()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                assert address not in (entry / "cmdline").read_bytes()
            except OSError:
                continue
