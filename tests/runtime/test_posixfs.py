"""posixfs gives what os / os.path give, and a create that asks no kubelet never imports os."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gpushare_common import ids, isolation
from gpushare_runtime import posixfs
from hypothesis import given
from hypothesis import strategies as st

from tests.support.kubelet import Kubelet

from .builders import NODE, gpu_device, identity, read_spec, signed, spec, write_bundle, write_key
from .conftest import REPO

paths = st.lists(st.sampled_from(["", ".", "..", "a", "b.c", "/", "//", "///", "x/", "/y"]),
                 max_size=8).map("/".join)


@given(paths)
def test_path_helpers_match_os_path(path: str) -> None:
    assert posixfs.normpath(path) == os.path.normpath(path)
    assert posixfs.dirname(path) == os.path.dirname(path)
    assert posixfs.basename(path) == os.path.basename(path)
    assert posixfs.abspath(path) == os.path.abspath(path)


@given(st.lists(paths, min_size=1, max_size=4))
def test_join_matches_os_path(parts: list[str]) -> None:
    assert posixfs.join(*parts) == os.path.join(*parts)


def test_makedirs_and_exists(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c"
    posixfs.makedirs(str(target), 0o700)
    posixfs.makedirs(str(target), 0o700)
    assert posixfs.exists(str(target)) and not posixfs.exists(str(tmp_path / "missing"))
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError):
        posixfs.makedirs(str(tmp_path / "file"))


def test_execvp_reports_a_missing_program() -> None:
    with pytest.raises(FileNotFoundError):
        posixfs.execvp("gpushare-no-such-program", ["x"])
    with pytest.raises(FileNotFoundError):
        posixfs.execvp("/nonexistent/program", ["x"])


SITE = [p for p in sys.path if p.endswith("site-packages")]
CREATE = """
import sys
sys.path[:0] = [{runtime!r}, {common!r}]
sys.path += {site!r}
import posix
posix.execv = lambda path, args: (print(" ".join(sys.modules)), sys.exit(0))
from gpushare_runtime.main import main
sys.exit(main(["create", "--bundle", {bundle!r}, "c1"]))
"""


def same_pod(tmp_path: Path, key: bytes, kubelet: Kubelet) -> dict[str, str]:
    write_bundle(tmp_path / "source", spec(identity("ns", "pod", "main"), [gpu_device()]))
    return {"gpushare.k8s.io/container-devices-from.*": "_/_/main"}


def capped_share(tmp_path: Path, key: bytes, kubelet: Kubelet) -> dict[str, str]:
    """What Allocate hands a capped share: JSON devices-from and the caps, both signed."""
    kubelet.allocate("ns/pod", "dind", "gpushare/share-gpu-4", ["gpushare-system/sh-0"])
    write_bundle(tmp_path / "source", spec(identity("gpushare-system", "sh", "main"), [gpu_device()]))
    for sub in ("pipe", "log", "shm"):
        (tmp_path / "isolation" / "gpushare-system_sh" / sub).mkdir(parents=True)
    devices = ids.format_devices_from({"gpushare-system/sh/main": {"*": ["gpushare-system/sh-0"]}})
    caps = isolation.format_share_caps(isolation.ShareCaps("mps", "nvidia.com/gpu", "gpushare-system/sh",
                                                           4, 1, 16384))
    return {**signed(key, "*", "from", devices), **signed(key, "*", "isolation", caps)}


def cdi_yaml_spot(tmp_path: Path, key: bytes, kubelet: Kubelet) -> dict[str, str]:
    """A spot borrower's card through an NVIDIA-style YAML CDI spec."""
    kubelet.allocate("ns/pod", "dind", "gpushare/spot-gpu", ["spot-0"])
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / "nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n"
        "    deviceNodes:\n    - path: /dev/nvidia0\n      type: c\n      major: 195\n"
        "    env:\n    - NVIDIA_VISIBLE_DEVICES=void\n")
    return signed(key, "*", "ids", ids.format_devices_ids({"nvidia.com/gpu": ["0"]}))


@pytest.mark.parametrize(("annotations", "asks_kubelet"), [(same_pod, False), (capped_share, True),
                                                           (cdi_yaml_spot, True)])
def test_create_path_does_not_import_os(tmp_path: Path, annotations: Any, asks_kubelet: bool,
                                        kubelet: Kubelet) -> None:
    """Only a create that copies from another pod asks the kubelet, and pays gRPC's imports."""
    key = write_key(tmp_path / "signing.key")
    target = {**identity("ns", "pod", "dind"), **annotations(tmp_path, key, kubelet)}
    bundle = write_bundle(tmp_path / "target", spec(target))
    config = tmp_path / "runtime.json"
    config.write_text(json.dumps({
        "lower_runtime": "/bin/true", "index_dir": "", "node_name": NODE,
        "key_file": str(tmp_path / "signing.key"), "cdi_dirs": [str(tmp_path / "cdi")],
        "isolation_dir": str(tmp_path / "isolation"), "pod_resources_socket": str(kubelet.socket)}))
    code = CREATE.format(runtime=str(REPO / "runtime"), common=str(REPO / "libs" / "common"),
                         bundle=str(bundle), site=SITE)
    result = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True,
                            env={"GPUSHARE_RUNTIME_CONFIG": str(config)}, check=False, timeout=30)
    assert result.returncode == 0, result.stderr
    assert read_spec(bundle)["linux"]["devices"]
    modules = set(result.stdout.split())
    assert {"gpushare_runtime.inject", "gpushare_common.ids"} <= modules
    assert ("grpc" in modules) == asks_kubelet
    if not asks_kubelet:
        assert not modules & {"os", "typing", "re", "json", "hashlib", "hmac", "dataclasses"}
