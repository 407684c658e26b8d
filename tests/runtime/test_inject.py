"""Annotations to edits: trust, source lookup, CDI and the vendor table, errors."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from gpushare_common import ids
from gpushare_runtime.config import RuntimeConfig, VendorResource
from gpushare_runtime.errors import AnnotationError
from gpushare_runtime.inject import Injector
from gpushare_runtime.lookup import Identity, find_source

from tests.support.kubelet import Kubelet

from .builders import NODE, gpu_device, identity, signed, spec, write_bundle, write_key

FROM = ids.ANN_DEVICES_FROM
IDS = ids.ANN_DEVICES_IDS
SIG_FROM = ids.signature_annotation(ids.KIND_FROM, "")


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "signing.key"
    write_key(path)
    return path


@pytest.fixture
def config(tmp_path: Path, key_file: Path, kubelet: Kubelet) -> RuntimeConfig:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    return RuntimeConfig(str(tmp_path / "runtime.json"), "runc", str(key_file), (str(cdi),),
                         index_dir=str(tmp_path / "index"), node_name=NODE, shadow_namespace="ns1",
                         pod_resources_socket=str(kubelet.socket))


@pytest.fixture
def bundles(tmp_path: Path) -> Path:
    directory = tmp_path / "bundles"
    write_bundle(directory / "shadow-main", spec(identity("ns1", "shadow", "main"),
                                                  [gpu_device()], ["NVIDIA_VISIBLE_DEVICES=GPU-0"]))
    second_card = gpu_device("/dev/nvidia1", 195, 1)
    write_bundle(directory / "dev-main", spec(identity("ns2", "dev", "main"), [second_card]))
    write_bundle(directory / "dev-sidecar", spec(identity("ns2", "dev", "sidecar")))
    return directory


def target(bundles: Path, annotations: dict[str, str], name: str = "dind") -> tuple[Path, dict[str, Any]]:
    content = spec({**identity("ns2", "dev", name), **annotations})
    return write_bundle(bundles / f"dev-{name}", content), content


def edits_for(config: RuntimeConfig, bundle: Path, content: dict[str, Any]) -> Any:
    return Injector(config, str(bundle), content).edits()


def test_same_pod_reference_needs_no_signature(config: RuntimeConfig, bundles: Path) -> None:
    bundle, content = target(bundles, {FROM + "dind": "_/_/main"})
    edits = edits_for(config, bundle, content)
    assert [d["path"] for d in edits.devices] == ["/dev/nvidia1"]


def test_star_target_applies_to_the_carrier(config: RuntimeConfig, bundles: Path) -> None:
    bundle, content = target(bundles, {FROM + "*": "_/_/main"})
    assert edits_for(config, bundle, content).devices


def test_escaped_annotation_key_is_applied(config: RuntimeConfig, bundles: Path) -> None:
    """A key JSON spells with escapes is still found (no cheap byte check skips it)."""
    from gpushare_runtime.cli import parse_invocation
    from gpushare_runtime.main import prepare_bundle
    from gpushare_runtime.runtimelog import RuntimeLog

    bundle, content = target(bundles, {"placeholder": "_/_/main"})
    escaped = '"gpushare.k8s.io\\/container-devices-\\u0066rom.*"'
    text = json.dumps(content).replace('"placeholder"', escaped)
    (bundle / "config.json").write_text(text)
    prepare_bundle(parse_invocation(["create", "-b", str(bundle), "c1"]), config, RuntimeLog(None, "text"))
    devices = json.loads((bundle / "config.json").read_text())["linux"]["devices"]
    assert [d["path"] for d in devices] == ["/dev/nvidia1"]


def test_other_target_is_ignored(config: RuntimeConfig, bundles: Path) -> None:
    bundle, content = target(bundles, {FROM + "other": "ns1/shadow/main"})
    assert not edits_for(config, bundle, content)


def test_signed_cross_pod_json_form(config: RuntimeConfig, key_file: Path, bundles: Path,
                                    kubelet: Kubelet) -> None:
    kubelet.allocate("ns2/dev", "dind", "gpushare/share-gpu-4", ["ns1/shadow-3"])
    value = ids.format_devices_from({"ns1/shadow/main": {"*": ["ns1/shadow-3"]}})
    bundle, content = target(bundles, signed(key_file.read_bytes().strip(), "dind", "from", value))
    edits = edits_for(config, bundle, content)
    assert [d["path"] for d in edits.devices] == ["/dev/nvidia0"]
    assert edits.env == {"NVIDIA_VISIBLE_DEVICES": ["GPU-0"]}


def test_resource_key_selects_vendor(config: RuntimeConfig, key_file: Path, bundles: Path,
                                     kubelet: Kubelet) -> None:
    kubelet.allocate("ns2/dev", "dind", "gpushare/share-gpu-4", ["ns1/shadow-3"])
    value = ids.format_devices_from({"ns1/shadow/main": {"amd.com/gpu": ["ns1/shadow-3"]}})
    bundle, content = target(bundles, signed(key_file.read_bytes().strip(), "dind", "from", value))
    with pytest.raises(AnnotationError, match="no devices"):
        edits_for(config, bundle, content)


ERRORS = [
    pytest.param({FROM + "dind": "ns1/shadow/main"}, "signature-from.dind is missing", id="unsigned"),
    pytest.param({FROM + "dind": "ns1/shadow/main", SIG_FROM + "dind": "v2:" + "ab" * 32},
                 "does not match", id="mis-signed"),
    pytest.param({FROM + "dind": "ns1/shadow/main", ids.ANN_SIGNATURE + "dind": "ab" * 32},
                 "upgrade the device plugin", id="unversioned"),
    pytest.param({FROM + "dind": "ns1/shadow/main", SIG_FROM + "dind": "ab" * 32},
                 "upgrade the device plugin", id="unversioned-new-key"),
    pytest.param({FROM + "dind": "ns1/shadow/main", SIG_FROM + "dind": "v9:00"},
                 "version 'v9' is not supported", id="unknown-version"),
    pytest.param({FROM + "dind": "ns9/shadow/main"},
                 "neither the target's namespace 'ns2' nor the ShadowPod namespace 'ns1'",
                 id="other-namespace"),
    pytest.param({FROM + "dind": "{not json"}, "malformed JSON", id="malformed-json"),
    pytest.param({FROM + "dind": "_/_/ghost"}, "unknown source", id="unknown-source"),
    pytest.param({FROM + "dind": "_/_/sidecar"}, "no devices", id="source-without-devices"),
    pytest.param({FROM + "dind": "_/_/dind"}, "its own source", id="self-reference"),
    pytest.param({IDS + "dind": '{"nvidia.com/gpu": ["7"]}'}, "signature-ids.dind is missing",
                 id="ids-unsigned"),
    pytest.param({IDS + "dind": '{"nvidia.com/gpu": ["a/../../dev/sda"]}'}, "not a valid device id",
                 id="ids-traversal"),
]


@pytest.mark.parametrize(("annotations", "reason"), ERRORS)
def test_refused(config: RuntimeConfig, bundles: Path, annotations: dict[str, str], reason: str) -> None:
    bundle, content = target(bundles, annotations)
    with pytest.raises(AnnotationError, match=reason) as caught:
        edits_for(config, bundle, content)
    assert caught.value.annotation.startswith(ids.DOMAIN)


def test_unresolvable_device_id(config: RuntimeConfig, key_file: Path, bundles: Path,
                                kubelet: Kubelet) -> None:
    kubelet.allocate("ns2/dev", "dind", "nvidia.com/gpu", ["99"])
    value = '{"nvidia.com/gpu": ["99"]}'
    bundle, content = target(bundles, signed(key_file.read_bytes().strip(), "dind", "ids", value))
    with pytest.raises(AnnotationError, match="unresolvable device ID") as caught:
        edits_for(config, bundle, content)
    assert caught.value.source == "nvidia.com/gpu=99"


def test_key_readable_by_others_is_refused(config: RuntimeConfig, key_file: Path, bundles: Path) -> None:
    os.chmod(key_file, 0o644)
    value = "ns1/shadow/main"
    bundle, content = target(bundles, signed(key_file.read_bytes().strip(), "dind", "from", value))
    with pytest.raises(AnnotationError, match="group or others"):
        edits_for(config, bundle, content)


CDI_JSON = {"cdiVersion": "0.5.0", "kind": "example.com/gpu", "devices": [
    {"name": "gpu7", "containerEdits": {
        "deviceNodes": [{"path": "/dev/gpu7", "type": "c", "major": 240, "minor": 7}],
        "env": ["EXAMPLE_VISIBLE_DEVICES=gpu7"]}}],
    "containerEdits": {"mounts": [{"hostPath": "/opt/lib", "containerPath": "/opt/lib"}]}}
CDI_YAML = """cdiVersion: 0.5.0
kind: example.com/npu
devices:
  - name: "3"
    containerEdits:
      deviceNodes:
        - path: /dev/npu3
          hostPath: /dev/null
      env: ["EXAMPLE_VISIBLE_DEVICES=3"]
"""


@pytest.mark.parametrize(("file_name", "text", "resource", "device_id", "path"), [
    ("example.json", json.dumps(CDI_JSON), "example.com/gpu", "gpu7", "/dev/gpu7"),
    ("example.yaml", CDI_YAML, "example.com/npu", "3", "/dev/npu3"),
])
def test_ids_through_cdi(config: RuntimeConfig, key_file: Path, bundles: Path, file_name: str,
                         text: str, resource: str, device_id: str, path: str, kubelet: Kubelet) -> None:
    Path(config.cdi_dirs[0], file_name).write_text(text)
    kubelet.allocate("ns2/dev", "dind", "gpushare/spot-gpu", [f"spot-{device_id}"])
    value = ids.format_devices_ids({resource: [device_id]})
    bundle, content = target(bundles, signed(key_file.read_bytes().strip(), "dind", "ids", value))
    edits = edits_for(config, bundle, content)
    assert [d["path"] for d in edits.devices] == [path]
    assert edits.fixed_env == {"EXAMPLE_VISIBLE_DEVICES": device_id}
    if resource == "example.com/npu":
        assert (edits.devices[0]["major"], edits.devices[0]["minor"]) == (1, 3)


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device node needs root")
def test_ids_through_vendor_table(config: RuntimeConfig, key_file: Path, bundles: Path,
                                  tmp_path: Path, kubelet: Kubelet) -> None:
    kubelet.allocate("ns2/dev", "dind", "example.com/card", ["5"])
    node = tmp_path / "card5"
    os.mknod(node, 0o666 | 0o020000, os.makedev(1, 3))
    config.vendors["example.com/card"] = VendorResource(
        "example.com/card", ("CARD_VISIBLE_DEVICES",), (str(tmp_path / "card{id}"),))
    value = ids.format_devices_ids({"example.com/card": ["5"]})
    bundle, content = target(bundles, signed(key_file.read_bytes().strip(), "dind", "ids", value))
    edits = edits_for(config, bundle, content)
    assert [(d["path"], d["major"], d["minor"]) for d in edits.devices] == [(str(node), 1, 3)]
    assert edits.env == {"CARD_VISIBLE_DEVICES": ["5"]}


def test_live_source_wins_then_newest(bundles: Path) -> None:
    older = write_bundle(bundles / "restart-1", spec(identity("ns3", "p", "main"), [gpu_device()]))
    newer = write_bundle(bundles / "restart-2", spec(identity("ns3", "p", "main"), [gpu_device()]))
    stamp = time.time()
    os.utime(older / "config.json", (stamp - 60, stamp - 60))
    wanted = Identity("ns3", "p", "main")
    found = find_source(str(bundles / "x"), wanted)
    assert found is not None and found.path == str(newer)
    (older / "init.pid").write_text(str(os.getpid()))
    found = find_source(str(bundles / "x"), wanted)
    assert found is not None and found.path == str(older) and found.live


def test_index_reads_only_new_bundles(bundles: Path, tmp_path: Path) -> None:
    index_dir = str(tmp_path / "index")
    wanted = Identity("ns1", "shadow", "main")
    first = find_source(str(bundles / "x"), wanted, index_dir)
    assert first is not None and first.path == str(bundles / "shadow-main")
    (bundles / "dev-main" / "config.json").write_text("{ not read again")
    again = find_source(str(bundles / "x"), wanted, index_dir)
    assert again is not None and again.path == first.path
    (bundles / "shadow-main" / "config.json").rename(tmp_path / "moved.json")
    (bundles / "shadow-main").rmdir()
    write_bundle(bundles / "shadow-main", spec(identity("ns9", "other", "main")))
    assert find_source(str(bundles / "x"), wanted, index_dir) is None
    assert find_source(str(bundles / "x"), Identity("ns9", "other", "main"), index_dir)


def test_corrupt_index_falls_back(bundles: Path, tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    index_dir.mkdir()
    name = str(bundles).strip("/").replace("/", "_") + ".json"
    (index_dir / name).write_text("[1, 2")
    found = find_source(str(bundles / "x"), Identity("ns1", "shadow", "main"), str(index_dir))
    assert found is not None


def test_crio_layout(tmp_path: Path) -> None:
    root = tmp_path / "overlay-containers"
    write_bundle(root / "aaa" / "userdata", spec(identity("ns", "p", "main"), [gpu_device()]))
    found = find_source(str(root / "bbb" / "userdata"), Identity("ns", "p", "main"))
    assert found is not None and found.container_id == "aaa"
