"""gpushare-runtime in front of real runc: device copy, cgroup rules, trust, pass-through."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest
from gpushare_common import ids
from gpushare_runtime.cdi import host_device

from tests.support.kubelet import Kubelet

from .builders import (
    KMSG_MAJOR,
    KMSG_MINOR,
    NULL_MAJOR,
    NULL_MINOR,
    identity,
    signed,
    spec,
    write_bundle,
    write_config,
    write_key,
)
from .conftest import Runc, make_rootfs

pytestmark = pytest.mark.containerd
PROBE = "stat -c %t:%T /dev/nvidia0 && echo gpushare-runtime-test > /dev/nvidia0 && echo written"


@pytest.fixture
def fake_card(tmp_path: Path) -> dict[str, Any]:
    """A character node with /dev/null's numbers standing in for nvidia0, as the source sees it."""
    node = tmp_path / "nvidia0"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(NULL_MAJOR, NULL_MINOR))
    return {**host_device(str(node)), "path": "/dev/nvidia0"}


def bundles_with_source(tmp_path: Path, rootfs: Path, device: dict[str, Any],
                        namespace: str = "ns1", pod: str = "pod1") -> Path:
    directory = tmp_path / "bundles"
    write_bundle(directory / "source", spec(identity(namespace, pod, "main"), [device],
                                             ["NVIDIA_VISIBLE_DEVICES=0"], rootfs=rootfs))
    return directory


def run_target(runc: Runc, directory: Path, rootfs: Path, annotations: dict[str, str],
               name: str = "target", log: Path | None = None) -> Any:
    content = spec({**identity("ns1", "pod1", "dind"), **annotations},
                   args=["sh", "-c", PROBE], rootfs=rootfs)
    bundle = write_bundle(directory / name, content)
    return runc("run", "--bundle", str(bundle), f"gpushare-{name}-{os.getpid()}", log=log)


def test_target_sees_device_and_can_write(runc: Runc, tmp_path: Path, rootfs: Path,
                                          fake_card: dict[str, Any]) -> None:
    directory = bundles_with_source(tmp_path, rootfs, fake_card)
    log = tmp_path / "runtime.log"
    result = run_target(runc, directory, rootfs, {ids.ANN_DEVICES_FROM + "dind": "_/_/main"}, log=log)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [f"{NULL_MAJOR:x}:{NULL_MINOR:x}", "written"]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert any(r["level"] == "info" and "copied /dev/nvidia0 from ns1/pod1/main" in r["msg"]
               for r in lines)
    written = json.loads((directory / "target" / "config.json").read_text())
    assert "NVIDIA_VISIBLE_DEVICES=0" in written["process"]["env"]
    assert stat.S_IMODE(os.stat(directory / "target" / "config.json").st_mode) == 0o640


def test_control_without_annotation_cannot(runc: Runc, tmp_path: Path, rootfs: Path,
                                           fake_card: dict[str, Any]) -> None:
    directory = bundles_with_source(tmp_path, rootfs, fake_card)
    result = run_target(runc, directory, rootfs, {}, name="control")
    assert result.returncode != 0
    assert "written" not in result.stdout


def test_device_cgroup_rule_is_copied(runc: Runc, tmp_path: Path, rootfs: Path) -> None:
    """/dev/kmsg's numbers are not allowed by default: only the copied rule lets the write through."""
    device = {"path": "/dev/nvidia0", "type": "c", "major": KMSG_MAJOR, "minor": KMSG_MINOR,
              "fileMode": 0o666, "uid": 0, "gid": 0}
    directory = bundles_with_source(tmp_path, rootfs, device)
    result = run_target(runc, directory, rootfs, {ids.ANN_DEVICES_FROM + "dind": "_/_/main"})
    assert result.returncode == 0, result.stderr
    assert "written" in result.stdout
    control = spec(identity("ns1", "pod1", "ctl"), args=["sh", "-c", PROBE], rootfs=rootfs)
    control["linux"]["devices"] = [device]
    bundle = write_bundle(directory / "no-rule", control)
    denied = runc("run", "--bundle", str(bundle), f"gpushare-norule-{os.getpid()}")
    assert denied.returncode != 0
    assert "not permitted" in denied.stderr + denied.stdout


def test_signed_cross_pod_reference(runc: Runc, tmp_path: Path, rootfs: Path,
                                    fake_card: dict[str, Any], kubelet: Kubelet) -> None:
    key = write_key(tmp_path / "signing.key")
    write_config(tmp_path / "runtime.json", key_file=str(tmp_path / "signing.key"),
                 pod_resources_socket=str(kubelet.socket))
    directory = bundles_with_source(tmp_path, rootfs, fake_card, "gpushare-system", "shadow-1")
    value = ids.format_devices_from({"gpushare-system/shadow-1/main": {"*": ["gpushare-system/shadow-1-0"]}})
    kubelet.allocate("ns1/pod1", "dind", "gpushare/share-gpu-2", ["gpushare-system/shadow-1-0"])
    result = run_target(runc, directory, rootfs, signed(key, "*", "from", value))
    assert result.returncode == 0, result.stderr
    assert "written" in result.stdout


def test_a_copied_annotation_gives_another_pod_nothing(runc: Runc, tmp_path: Path, rootfs: Path,
                                                       fake_card: dict[str, Any], kubelet: Kubelet) -> None:
    """The same signed annotation on a pod the kubelet allocated nothing: the create fails."""
    key = write_key(tmp_path / "signing.key")
    write_config(tmp_path / "runtime.json", key_file=str(tmp_path / "signing.key"),
                 pod_resources_socket=str(kubelet.socket))
    directory = bundles_with_source(tmp_path, rootfs, fake_card, "gpushare-system", "shadow-1")
    value = ids.format_devices_from({"gpushare-system/shadow-1/main": {"*": ["gpushare-system/shadow-1-0"]}})
    kubelet.admit("ns1/pod1", "dind")
    log = tmp_path / "runtime.log"
    result = run_target(runc, directory, rootfs, signed(key, "*", "from", value), log=log)
    assert result.returncode == 1 and "written" not in result.stdout
    assert "was not allocated to container ns1/pod1/dind by the kubelet" in log.read_text()


def test_unsigned_cross_pod_reference_fails_clearly(runc: Runc, tmp_path: Path, rootfs: Path,
                                                    fake_card: dict[str, Any]) -> None:
    directory = bundles_with_source(tmp_path, rootfs, fake_card, "gpushare-system", "shadow-1")
    log = tmp_path / "runtime.log"
    annotation = ids.ANN_DEVICES_FROM + "dind"
    content = spec({**identity("ns1", "pod1", "dind"), annotation: "gpushare-system/shadow-1/main"},
                   rootfs=rootfs)
    bundle = write_bundle(directory / "target", content)
    before = (bundle / "config.json").read_bytes()
    result = runc("create", "--bundle", str(bundle), "gpushare-unsigned", log=log)
    assert result.returncode == 1
    for text in (result.stderr, log.read_text()):
        assert annotation in text and "gpushare-system/shadow-1/main" in text
        assert "signature-from.dind is missing" in text
    assert json.loads(log.read_text().splitlines()[-1])["level"] == "error"
    assert (bundle / "config.json").read_bytes() == before
    assert runc("state", "gpushare-unsigned").returncode != 0
    assert sorted(p.name for p in bundle.iterdir()) == ["config.json"]


def test_pass_through_matches_runc(runc: Runc, tmp_path: Path, rootfs: Path) -> None:
    bundle = write_bundle(tmp_path / "sleeper", spec(args=["sleep", "30"], rootfs=rootfs))
    name = f"gpushare-pass-{os.getpid()}"
    assert runc("create", "--bundle", str(bundle), name).returncode == 0
    for args in (["state", name], ["ps", "--format", "json", name], ["list", "-q"],
                 ["state", "no-such-container"], ["kill", "no-such-container", "KILL"]):
        ours, theirs = runc(*args), runc(*args, through=False)
        assert (ours.returncode, ours.stdout, _untimed(ours.stderr)) == (
            theirs.returncode, theirs.stdout, _untimed(theirs.stderr)), args
    assert runc("start", name).returncode == 0
    assert json.loads(runc("state", name).stdout)["status"] == "running"
    executed = runc("exec", name, "echo", "inside")
    assert (executed.returncode, executed.stdout) == (0, "inside\n")
    stats = runc("events", "--stats", name)
    assert stats.returncode == 0 and json.loads(stats.stdout)["type"] == "stats"
    assert runc("kill", name, "KILL").returncode == 0
    assert runc("delete", "-f", name).returncode == 0
    assert runc("state", name).returncode != 0


def test_signed_device_ids_through_vendor_table(runc: Runc, tmp_path: Path, kubelet: Kubelet) -> None:
    """A spot-style injection: real device IDs resolved through the vendor table's node template."""
    node = tmp_path / "cards" / "card7"
    node.parent.mkdir()
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(NULL_MAJOR, NULL_MINOR))
    key = write_key(tmp_path / "signing.key")
    write_config(tmp_path / "runtime.json", key_file=str(tmp_path / "signing.key"), vendors={
        "example.com/card": {"env": ["CARD_VISIBLE_DEVICES"],
                             "device_nodes": [str(node.parent / "card{id}")]}},
        pod_resources_socket=str(kubelet.socket))
    kubelet.allocate("spot/borrower", "main", "gpushare/spot-gpu", ["spot-7"])
    rootfs = make_rootfs(tmp_path / "own-rootfs")
    value = ids.format_devices_ids({"example.com/card": ["7"]})
    probe = f"stat -c %t:%T {node} && echo x > {node} && echo $CARD_VISIBLE_DEVICES"
    content = spec({**identity("spot", "borrower", "main"), **signed(key, "*", "ids", value)},
                   args=["sh", "-c", probe], rootfs=rootfs)
    bundle = write_bundle(tmp_path / "bundles" / "borrower", content)
    result = runc("run", "--bundle", str(bundle), f"gpushare-ids-{os.getpid()}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [f"{NULL_MAJOR:x}:{NULL_MINOR:x}", "7"]


def test_cdi_edits_reach_the_container_and_hooks_run(runc: Runc, tmp_path: Path, kubelet: Kubelet) -> None:
    """A spot-style injection through a CDI spec: its node, env, groups and hook all take effect."""
    node = tmp_path / "cards" / "card3"
    node.parent.mkdir()
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(NULL_MAJOR, NULL_MINOR))
    marker = tmp_path / "hook-ran"
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "card.json").write_text(json.dumps({
        "cdiVersion": "0.7.0", "kind": "example.com/card", "devices": [{"name": "3", "containerEdits": {
            "deviceNodes": [{"path": "/dev/card3", "hostPath": str(node)}],
            "env": ["CARD_VISIBLE_DEVICES=3"], "additionalGids": [44],
            "hooks": [{"hookName": "createRuntime", "path": "/bin/sh",
                       "args": ["sh", "-c", f"echo ran > {marker}"]}]}}]}))
    key = write_key(tmp_path / "signing.key")
    write_config(tmp_path / "runtime.json", key_file=str(tmp_path / "signing.key"), cdi_dirs=[str(cdi)],
                 pod_resources_socket=str(kubelet.socket))
    kubelet.allocate("spot/borrower", "main", "example.com/card", ["3"])
    value = ids.format_devices_ids({"example.com/card": ["3"]})
    probe = "echo x > /dev/card3 && echo $CARD_VISIBLE_DEVICES && cat /proc/self/status"
    content = spec({**identity("spot", "borrower", "main"), **signed(key, "*", "ids", value)},
                   args=["sh", "-c", probe], rootfs=make_rootfs(tmp_path / "own-rootfs"))
    bundle = write_bundle(tmp_path / "bundles" / "borrower", content)
    result = runc("run", "--bundle", str(bundle), f"gpushare-cdi-{os.getpid()}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "3" and marker.read_text() == "ran\n"
    groups = next(line for line in lines if line.startswith("Groups:")).split()[1:]
    assert "44" in groups


def test_capped_share_gets_the_daemons_directories(runc: Runc, tmp_path: Path, rootfs: Path,
                                                   fake_card: dict[str, Any], kubelet: Kubelet) -> None:
    """Allocate-shaped annotations of a capped share: the caps in the environment, the
    ShadowPod's pipe directory and /dev/shm bound in, shared with the host directory."""
    from gpushare_common import isolation

    host = tmp_path / "isolation" / "gpushare-system_shadow-1"
    for sub in ("pipe", "log", "shm"):
        (host / sub).mkdir(parents=True)
    (host / "pipe" / "control").write_text("daemon pipe\n")
    key = write_key(tmp_path / "signing.key")
    write_config(tmp_path / "runtime.json", key_file=str(tmp_path / "signing.key"),
                 isolation_dir=str(tmp_path / "isolation"), pod_resources_socket=str(kubelet.socket))
    kubelet.allocate("team/app", "main", "gpushare/share-gpu-4", ["gpushare-system/shadow-1-2"])
    directory = bundles_with_source(tmp_path, rootfs, fake_card, "gpushare-system", "shadow-1")
    devices = ids.format_devices_from({"gpushare-system/shadow-1/main": {"*": ["gpushare-system/shadow-1-2"]}})
    caps = isolation.format_share_caps(isolation.ShareCaps(
        "mps", "nvidia.com/gpu", "gpushare-system/shadow-1", 4, 1, 16384))
    probe = ("cat /tmp/nvidia-mps/control && echo $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT "
             "$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE && echo share > /dev/shm/from-share")
    content = spec({**identity("team", "app", "main"), **signed(key, "*", "from", devices),
                    **signed(key, "*", "isolation", caps)}, args=["sh", "-c", probe], rootfs=rootfs)
    bundle = write_bundle(directory / "capped", content)
    result = runc("run", "--bundle", str(bundle), f"gpushare-capped-{os.getpid()}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["daemon pipe", "0=4096M 25"]
    assert (host / "shm" / "from-share").read_text() == "share\n"


def _untimed(log: str) -> str:
    """runc's log lines without their time: two runs may straddle a second."""
    return re.sub(r'^time="[^"]*" ', "", log, flags=re.M)
