"""A tenant cannot reach another tenant's card through the runtime: a reference into a third
namespace is refused even when it carries a valid signature (the device plugin only ever signs
sources in the system namespace), a signature made for another node is refused, a SharePod's
signed annotation copied onto another pod of the same node gives that pod nothing (the kubelet
allocated it no such device), and a bundle whose identity keys contradict each other is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpushare_common import ids
from gpushare_runtime.config import RuntimeConfig
from gpushare_runtime.errors import AnnotationError, BundleError
from gpushare_runtime.inject import Injector
from gpushare_runtime.lookup import IdentityConflict, identity_of

from tests.runtime.builders import NODE, gpu_device, identity, signed, spec, write_bundle, write_key
from tests.support.kubelet import Kubelet

SYSTEM = "gpushare-system"
SHARE = "gpushare/share-gpu-4"
TEAM_A_DEVICES = ids.format_devices_from({f"{SYSTEM}/shadow-1/main": {"*": [f"{SYSTEM}/shadow-1-0"]}})


@pytest.fixture
def setup(tmp_path: Path, kubelet: Kubelet) -> tuple[RuntimeConfig, bytes, Path]:
    key = write_key(tmp_path / "signing.key")
    config = RuntimeConfig(str(tmp_path / "runtime.json"), "runc", str(tmp_path / "signing.key"), (),
                           index_dir=str(tmp_path / "index"), node_name=NODE, shadow_namespace=SYSTEM,
                           pod_resources_socket=str(kubelet.socket))
    bundles = tmp_path / "bundles"
    write_bundle(bundles / "a-shadow", spec(identity("team-a", "shadow-a", "main"), [gpu_device()]))
    write_bundle(bundles / "sys-shadow", spec(identity(SYSTEM, "shadow-1", "main"), [gpu_device()]))
    return config, key, bundles


def create(config: RuntimeConfig, bundles: Path, annotations: dict[str, str]) -> object:
    content = spec({**identity("team-b", "inference-1", "app"), **annotations})
    bundle = write_bundle(bundles / "b-app", content)
    return Injector(config, str(bundle), content).edits()


def test_a_signed_reference_into_another_tenants_namespace_is_refused(
        setup: tuple[RuntimeConfig, bytes, Path]) -> None:
    config, key, bundles = setup
    value = ids.format_devices_from({"team-a/shadow-a/main": {"*": ["team-a/shadow-a-3"]}})
    with pytest.raises(AnnotationError, match="neither the target's namespace 'team-b' nor the ShadowPod "
                                              "namespace 'gpushare-system'"):  # fmt: skip
        create(config, bundles, signed(key, "*", ids.KIND_FROM, value))


def test_the_system_namespace_shadow_pod_is_allowed(setup: tuple[RuntimeConfig, bytes, Path],
                                                   kubelet: Kubelet) -> None:
    config, key, bundles = setup
    kubelet.allocate("team-b/inference-1", "app", SHARE, [f"{SYSTEM}/shadow-1-0"])
    assert create(config, bundles, signed(key, "*", ids.KIND_FROM, TEAM_A_DEVICES))
    assert create(config, bundles, signed(key, "*", ids.KIND_FROM, TEAM_A_DEVICES))  # restarted: again


@pytest.mark.parametrize("allocated", [[], [f"{SYSTEM}/shadow-1-1"], [f"{SYSTEM}/shadow-2-0"]])
def test_a_sharepods_annotation_copied_onto_another_pod_gives_nothing(
        setup: tuple[RuntimeConfig, bytes, Path], kubelet: Kubelet, allocated: list[str]) -> None:
    """team-a's SharePod was allocated shadow-1-0 and its Allocate annotations say so, signed; team-b
    copies them onto a pod of its own on the same node that asks for no GPU (or for another share):
    the kubelet gave team-b's container no such device, so the runtime copies nothing."""
    config, key, bundles = setup
    kubelet.allocate("team-a/trainer", "main", SHARE, [f"{SYSTEM}/shadow-1-0"])
    kubelet.allocate("team-b/inference-1", "app", SHARE, allocated)
    with pytest.raises(AnnotationError, match="device gpushare-system/shadow-1-0 was not allocated to "
                                              "container team-b/inference-1/app by the kubelet"):
        create(config, bundles, signed(key, "*", ids.KIND_FROM, TEAM_A_DEVICES))


def test_a_pod_the_kubelet_does_not_run_gets_nothing(setup: tuple[RuntimeConfig, bytes, Path]) -> None:
    config, key, bundles = setup
    with pytest.raises(AnnotationError, match="runs no pod team-b/inference-1"):
        create(config, bundles, signed(key, "*", ids.KIND_FROM, TEAM_A_DEVICES))


def test_a_spot_annotation_copied_onto_another_pod_gives_nothing(
        setup: tuple[RuntimeConfig, bytes, Path], kubelet: Kubelet) -> None:
    config, key, bundles = setup
    kubelet.allocate("spot/borrower", "main", "gpushare/spot-gpu", ["spot-GPU-a"])
    kubelet.admit("team-b/inference-1", "app")
    value = ids.format_devices_ids({"nvidia.com/gpu": ["GPU-a"]})
    with pytest.raises(AnnotationError, match="device GPU-a was not allocated"):
        create(config, bundles, signed(key, "*", ids.KIND_IDS, value))


def test_a_signed_reference_naming_no_devices_is_refused(setup: tuple[RuntimeConfig, bytes, Path],
                                                         kubelet: Kubelet) -> None:
    config, key, bundles = setup
    kubelet.allocate("team-b/inference-1", "app", SHARE, [f"{SYSTEM}/shadow-1-0"])
    with pytest.raises(AnnotationError, match="names none"):
        create(config, bundles, signed(key, "*", ids.KIND_FROM, f"{SYSTEM}/shadow-1/main"))


def test_no_kubelet_no_copy(setup: tuple[RuntimeConfig, bytes, Path], tmp_path: Path) -> None:
    config, key, bundles = setup
    config.pod_resources_socket = str(tmp_path / "no-kubelet.sock")
    with pytest.raises(AnnotationError, match="cannot ask the kubelet which devices container "
                                              "team-b/inference-1/app was allocated"):
        create(config, bundles, signed(key, "*", ids.KIND_FROM, TEAM_A_DEVICES))


@pytest.mark.parametrize("crio", [{"io.kubernetes.pod.namespace": "gpushare-system"},
                                  {"io.kubernetes.pod.name": "shadow-1"},
                                  {"io.kubernetes.container.name": "main"}])
def test_contradictory_identity_keys_are_refused(setup: tuple[RuntimeConfig, bytes, Path], kubelet: Kubelet,
                                                 crio: dict[str, str]) -> None:
    """containerd's keys name team-b's pod, CRI-O's another container: which one is it? Refused."""
    config, key, bundles = setup
    kubelet.allocate("team-b/inference-1", "app", SHARE, [f"{SYSTEM}/shadow-1-0"])
    with pytest.raises(BundleError, match="identity keys disagree"):
        create(config, bundles, {**crio, **signed(key, "*", ids.KIND_FROM, TEAM_A_DEVICES)})
    with pytest.raises(IdentityConflict):
        identity_of({"annotations": {**identity("team-b", "inference-1", "app"), **crio}})


def test_agreeing_identity_keys_are_one_identity() -> None:
    both = {**identity("team-b", "p", "c"), "io.kubernetes.pod.namespace": "team-b",
            "io.kubernetes.pod.name": "p", "io.kubernetes.container.name": "c"}
    assert str(identity_of({"annotations": both})) == "team-b/p/c"


def test_a_signature_made_for_another_node_is_refused(setup: tuple[RuntimeConfig, bytes, Path]) -> None:
    config, key, bundles = setup
    value = ids.format_devices_from({f"{SYSTEM}/shadow-1/main": {"*": [f"{SYSTEM}/shadow-1-0"]}})
    with pytest.raises(AnnotationError, match="does not match"):
        create(config, bundles, signed(key, "*", ids.KIND_FROM, value, node="gpu-node-9"))
