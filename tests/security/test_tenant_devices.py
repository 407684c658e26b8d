"""A tenant cannot reach another tenant's card through the runtime: a reference into a third
namespace is refused even when it carries a valid signature (the device plugin only ever signs
sources in the system namespace), and a signature made for another node is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpushare_common import ids
from gpushare_runtime.config import RuntimeConfig
from gpushare_runtime.errors import AnnotationError
from gpushare_runtime.inject import Injector

from tests.runtime.builders import NODE, gpu_device, identity, signed, spec, write_bundle, write_key

SYSTEM = "gpushare-system"


@pytest.fixture
def setup(tmp_path: Path) -> tuple[RuntimeConfig, bytes, Path]:
    key = write_key(tmp_path / "signing.key")
    config = RuntimeConfig(str(tmp_path / "runtime.json"), "runc", str(tmp_path / "signing.key"), (),
                           index_dir=str(tmp_path / "index"), node_name=NODE, shadow_namespace=SYSTEM)
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


def test_the_system_namespace_shadow_pod_is_allowed(setup: tuple[RuntimeConfig, bytes, Path]) -> None:
    config, key, bundles = setup
    value = ids.format_devices_from({f"{SYSTEM}/shadow-1/main": {"*": [f"{SYSTEM}/shadow-1-0"]}})
    assert create(config, bundles, signed(key, "*", ids.KIND_FROM, value))


def test_a_signature_made_for_another_node_is_refused(setup: tuple[RuntimeConfig, bytes, Path]) -> None:
    config, key, bundles = setup
    value = ids.format_devices_from({f"{SYSTEM}/shadow-1/main": {"*": [f"{SYSTEM}/shadow-1-0"]}})
    with pytest.raises(AnnotationError, match="does not match"):
        create(config, bundles, signed(key, "*", ids.KIND_FROM, value, node="gpu-node-9"))
