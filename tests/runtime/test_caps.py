"""Share caps end to end: the share plugin's Allocate signs them, the runtime computes what each
share's container gets, and refuses anything forged, unsigned or impossible to compute."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gpushare_common import ids
from gpushare_common import isolation as iso
from gpushare_deviceplugin.handlers.base import Signer
from gpushare_deviceplugin.handlers.share import ShadowPodView, ShareLogic
from gpushare_runtime.config import RuntimeConfig, VendorResource, parse_config
from gpushare_runtime.edits import DeviceEdits, apply_edits
from gpushare_runtime.errors import AnnotationError, ConfigError
from gpushare_runtime.inject import Injector

from tests.support.kubelet import Kubelet

from .builders import NODE, gpu_device, identity, signed, spec, write_bundle

KEY = b"0123456789abcdef0123456789abcdef"
SYSTEM = "gpushare-system"
KINDS = {"share": "share-gpu", "share-dev": "share-dev-gpu"}
CARDS_MIB = (16384, 24576, 40960, 81920, 143771)
ISOLATION = ids.ANN_DEVICES_ISOLATION + "*"
SIG_ISOLATION = ids.signature_annotation(ids.KIND_ISOLATION, "*")


class Node:
    """One node: its key file, runtime configuration, bundles and isolation directories."""

    def __init__(self, root: Path, kubelet: Kubelet, card_memory: int | None = 81920,
                 opt_out: bool = False) -> None:
        self.root = root
        self.kubelet = kubelet
        root.mkdir(parents=True, exist_ok=True)
        key_file = root / "signing.key"
        key_file.write_bytes(KEY)
        key_file.chmod(0o600)
        self.config = RuntimeConfig(str(root / "runtime.json"), key_file=str(key_file),
                                    index_dir="", node_name=NODE,
                                    isolation_dir=str(root / "isolation"),
                                    pod_resources_socket=str(kubelet.socket))
        self.card_memory = card_memory
        self.opt_out = opt_out

    def shadow(self, name: str, spec_n: int, kind: str = "share", up: bool = True) -> ShareLogic:
        """A capped ShadowPod (its bundle, its daemon's directories) and its share plugin."""
        write_bundle(self.root / "bundles" / name, spec(identity(SYSTEM, name, "main"), [gpu_device()],
                                                        ["NVIDIA_VISIBLE_DEVICES=GPU-0"]))
        if up:
            for sub in ("pipe", "log", "shm"):
                (self.root / "isolation" / f"{SYSTEM}_{name}" / sub).mkdir(parents=True, exist_ok=True)
        memory = {"nvidia.com/gpu": self.card_memory} if self.card_memory else {}
        logic = ShareLogic(f"gpushare/{KINDS[kind]}-{spec_n}", spec_n, Signer(KEY, NODE),
                           card_memory_mib=memory, opt_out=self.opt_out)
        logic.replace_shadows([ShadowPodView(SYSTEM, name, kind, spec_n, vendor_resource="nvidia.com/gpu",
                                             isolation="mps")])
        return logic

    def create(self, annotations: dict[str, str], pod: dict[str, str] | None = None) -> DeviceEdits:
        content = spec({**identity("team", "app", "main"), **annotations, **(pod or {})})
        bundle = write_bundle(self.root / "bundles" / "target", content)
        return Injector(self.config, str(bundle), content).edits()

    def allocate(self, logic: ShareLogic, shadow: str, held: int) -> dict[str, str]:
        """The kubelet gives team/app's container ``held`` devices, then asks the plugin's Allocate."""
        devices = [f"{SYSTEM}/{shadow}-{i}" for i in range(held)]
        self.kubelet.allocate("team/app", "main", logic.resource, devices)
        [annotations] = logic.allocate([devices])
        return annotations


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("spec_n", range(2, 17))
def test_every_share_gets_its_part_of_the_card(tmp_path: Path, kubelet: Kubelet, kind: str,
                                               spec_n: int) -> None:
    for card in CARDS_MIB:
        node = Node(tmp_path / f"card-{card}", kubelet, card_memory=card)
        logic = node.shadow("sh", spec_n, kind)
        for held in sorted({1, spec_n // 2, spec_n}):
            edits = node.create(node.allocate(logic, "sh", held))
            assert edits.fixed_env == {
                "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
                "CUDA_MPS_LOG_DIRECTORY": "/var/log/nvidia-mps",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={card * held // spec_n}M",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(100 * held // spec_n),
            }
            host = f"{node.config.isolation_dir}/{SYSTEM}_sh"
            assert [(m["source"], m["destination"]) for m in edits.replaced_mounts] == [
                (f"{host}/pipe", "/tmp/nvidia-mps"), (f"{host}/log", "/var/log/nvidia-mps"),
                (f"{host}/shm", "/dev/shm")]
            assert [d["path"] for d in edits.devices] == ["/dev/nvidia0"]


def test_caps_override_the_pods_own_values_and_take_over_dev_shm(tmp_path: Path, kubelet: Kubelet) -> None:
    node = Node(tmp_path, kubelet)
    edits = node.create(node.allocate(node.shadow("sh", 4), "sh", 1))
    base = spec(env=["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=80G"])
    result = apply_edits(base, edits)
    env = result["process"]["env"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in env and "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M" in env
    assert not any(e.endswith("=100") or e.endswith("=0=80G") for e in env)
    shm = [m for m in result["mounts"] if m["destination"] == "/dev/shm"]
    assert len(shm) == 1 and shm[0]["source"].endswith(f"{SYSTEM}_sh/shm")
    order = [m["destination"] for m in result["mounts"]]
    assert order.index("/dev/shm") == [m["destination"] for m in base["mounts"]].index("/dev/shm")
    assert apply_edits(result, edits) == result


@pytest.mark.parametrize(("allowed", "pod", "outcome"), [
    (False, {}, "capped"),
    (True, {}, "capped"),
    (True, {ids.ANN_ISOLATION: "none"}, "soft"),
    (False, {ids.ANN_ISOLATION: "none"}, "may not opt out"),
    (True, {ids.ANN_ISOLATION: "off"}, "expected 'none'"),
    (False, {ids.ANN_COMPUTE_PERCENTAGE: "10"}, "10"),
    (False, {ids.ANN_COMPUTE_PERCENTAGE: "30"}, "[1, 25]"),
])
def test_what_the_pod_may_ask_for(tmp_path: Path, kubelet: Kubelet, allowed: bool, pod: dict[str, str],
                                  outcome: str) -> None:
    node = Node(tmp_path, kubelet, opt_out=allowed)
    annotations = node.allocate(node.shadow("sh", 4), "sh", 1)
    if outcome in ("capped", "soft", "10"):
        edits = node.create(annotations, pod)
        percent = edits.fixed_env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
        assert percent == {"capped": "25", "soft": None, "10": "10"}[outcome]
        assert bool(edits.replaced_mounts) == (outcome != "soft")
        return
    with pytest.raises(AnnotationError) as caught:
        node.create(annotations, pod)
    assert outcome in str(caught.value)


def forged(annotations: dict[str, str], how: str) -> dict[str, str]:
    caps = json.loads(annotations[ISOLATION])
    raised = iso.format_share_caps(iso.ShareCaps(**{**caps, "k": 4}))
    sig_from = ids.signature_annotation(ids.KIND_FROM, "*")
    return {
        "unsigned": {**annotations, SIG_ISOLATION: ""},
        "altered": {**annotations, ISOLATION: raised},
        "other key": {**annotations, **signed(b"x" * 32, "*", "isolation", raised)},
        "other node": {**annotations, **signed(KEY, "*", "isolation", raised, node="node-b")},
        "kind swap": {**annotations, ISOLATION: annotations[ids.ANN_DEVICES_FROM + "*"],
                      SIG_ISOLATION: annotations[sig_from]},
        "pod-written": {**annotations, ids.ANN_DEVICES_ISOLATION + "main": raised},
        "legacy": {**annotations, SIG_ISOLATION: "", ids.ANN_SIGNATURE + "*": "ab" * 32},
    }[how]


@pytest.mark.parametrize(("how", "reason"), [
    ("unsigned", "signature-isolation.* is missing"),
    ("altered", "signature-isolation.*: does not match"),
    ("other key", "does not match"),
    ("other node", "does not match"),
    ("kind swap", "does not match"),
    ("pod-written", "signature-isolation.main is missing"),
    ("legacy", "upgrade the device plugin"),
])
def test_forged_caps_are_refused(tmp_path: Path, kubelet: Kubelet, how: str, reason: str) -> None:
    node = Node(tmp_path, kubelet)
    annotations = forged(node.allocate(node.shadow("sh", 8), "sh", 1), how)
    with pytest.raises(AnnotationError, match="isolation") as caught:
        node.create(annotations)
    assert reason in str(caught.value)


def test_caps_must_describe_the_allocated_devices(tmp_path: Path, kubelet: Kubelet) -> None:
    node = Node(tmp_path, kubelet)
    logic = node.shadow("sh", 4)
    caps = json.loads(node.allocate(logic, "sh", 1)[ISOLATION])
    lonely = signed(KEY, "*", "isolation", json.dumps(caps))
    with pytest.raises(AnnotationError, match="copies from nothing"):
        node.create(lonely)
    two = node.allocate(logic, "sh", 2)
    with pytest.raises(AnnotationError, match="caps are for 1 share"):
        node.create({**two, **lonely})
    node.shadow("other", 4)
    elsewhere = signed(KEY, "*", "isolation", json.dumps({**caps, "shadow": f"{SYSTEM}/other"}))
    with pytest.raises(AnnotationError, match="from its ShadowPod alone"):
        node.create({**node.allocate(logic, "sh", 1), **elsewhere})


@pytest.mark.parametrize(("setup", "reason"), [
    ("no memory", "card_memory_mib is not known"),
    ("soft vendor", "this node's vendor table has 'soft share' for nvidia.com/gpu"),
    ("daemon down", "is missing: the ShadowPod's mps daemon is not up"),
    ("no node name", "has no node_name"),
])
def test_caps_that_cannot_be_computed_fail_the_create(tmp_path: Path, kubelet: Kubelet, setup: str,
                                                     reason: str) -> None:
    node = Node(tmp_path, kubelet, card_memory=None if setup == "no memory" else 81920)
    annotations = node.allocate(node.shadow("sh", 4, up=setup != "daemon down"), "sh", 1)
    if setup == "soft vendor":
        node.config.vendors["nvidia.com/gpu"] = VendorResource("nvidia.com/gpu", ("NVIDIA_VISIBLE_DEVICES",))
    if setup == "no node name":
        node.config.node_name = ""
    with pytest.raises(AnnotationError) as caught:
        node.create(annotations)
    assert reason in str(caught.value)


def test_vendor_isolation_entry_from_the_configuration(tmp_path: Path) -> None:
    doc: dict[str, Any] = {"node_name": NODE, "vendors": {"example.com/npu": {
        "env": ["NPU_VISIBLE"], "device_nodes": ["/dev/npu{id}"],
        "isolation": {"name": "npu_mem", "env": {"NPU_MEMORY_LIMIT_MB": "{card_memory_mib * k / n}"}}}}}
    config = parse_config("/etc/gpushare/runtime.json", json.dumps(doc))
    profile = config.isolation_of("example.com/npu")
    assert profile.name == "npu_mem" and config.isolation_of("amd.com/gpu").soft
    assert config.isolation_of("nvidia.com/gpu").name == "mps"
    doc["vendors"]["example.com/npu"]["isolation"]["env"] = {"NPU_MEMORY_LIMIT_MB": "{memory}"}
    with pytest.raises(ConfigError) as caught:
        parse_config("/etc/gpushare/runtime.json", json.dumps(doc))
    assert str(caught.value) == ("runtime configuration /etc/gpushare/runtime.json: vendors['example.com/npu']"
                                 ".isolation.env.NPU_MEMORY_LIMIT_MB: unknown variable 'memory' (known: "
                                 "card_memory_mib, k, n, percent, shadow_dir)")
