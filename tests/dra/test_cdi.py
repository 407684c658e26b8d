"""CDI spec writing: what each role gets, checked against the CDI schema and by the runtime's loader."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from gpushare_common import dra, isolation
from gpushare_common.vendors import DEFAULT_VENDORS, VendorResource
from gpushare_dra_driver.cdi import CdiSpecError, check_spec, claim_spec
from gpushare_dra_driver.claims import Allocated
from gpushare_runtime.cdi import CdiRegistry

from tests.dra.builders import GPU, NODE, card, device_node
from tests.runtime.cdi_fixtures import CDI_SCHEMA

UID = str(uuid.uuid4())
MOUNT = {"source": "/usr/bin/nvidia-smi", "destination": "/usr/bin/nvidia-smi", "type": "bind",
         "options": ["ro", "bind"]}
VENDORS = {GPU: VendorResource(GPU, ("NVIDIA_VISIBLE_DEVICES",), ("/dev/nvidia{id}", "/dev/nvidiactl",
                                                                   "/dev/nvidia-uvm"), (MOUNT,))}


def no_caps(item: Allocated) -> None:
    return None


def spec(items: list[Allocated], root: str = "", caps: Any = no_caps) -> dict[str, Any]:
    return claim_spec(UID, items, VENDORS, root, lambda path: path == "/dev/nvidiactl", caps)


def test_a_share_gets_its_card_the_control_nodes_that_exist_and_the_vendor_variables(tmp_path: Path) -> None:
    doc = spec([Allocated("gpu", f"gpu-{NODE}-1", card(1), dra.ROLE_SHARE, 25)], root=str(tmp_path))
    jsonschema.validate(doc, CDI_SCHEMA)
    check_spec(doc)
    (device,) = doc["devices"]
    assert device["name"] == f"share.{UID}.GPU-{NODE}-1"
    assert device["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia1", "hostPath": f"{tmp_path}/dev/nvidia1"},
        {"path": "/dev/nvidiactl", "hostPath": f"{tmp_path}/dev/nvidiactl"}]
    assert doc["containerEdits"] == {
        "env": [f"NVIDIA_VISIBLE_DEVICES=GPU-{NODE}-1"],
        "mounts": [{"hostPath": "/usr/bin/nvidia-smi", "containerPath": "/usr/bin/nvidia-smi",
                    "options": ["ro", "bind"], "type": "bind"}]}


def test_the_runtime_resolves_every_device_of_the_spec(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("device nodes need root")
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        device_node(tmp_path / "dev" / name)
    items = [Allocated("gpu", f"gpu-{NODE}-0", card(0), dra.ROLE_EXCLUSIVE, 100),
             Allocated("gpu", f"gpu-{NODE}-1", card(1), dra.ROLE_EXCLUSIVE, 100)]
    doc = spec(items, root=str(tmp_path))
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / "claim.json").write_text(json.dumps(doc))
    registry, seen = CdiRegistry((str(tmp_path / "cdi"),)), set[str]()
    first = registry.resolve(dra.CDI_KIND, f"exclusive.{UID}.GPU-{NODE}-0", (0, 0), seen)
    second = registry.resolve(dra.CDI_KIND, f"exclusive.{UID}.GPU-{NODE}-1", (0, 0), seen)
    assert first is not None and second is not None
    first.update(second)  # as the runtime merges a container's devices
    assert sorted(d["path"] for d in first.devices) == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"]
    assert first.fixed_env == {"NVIDIA_VISIBLE_DEVICES": f"GPU-{NODE}-0,GPU-{NODE}-1"}


def test_a_capped_share_carries_its_caps() -> None:
    profile = isolation.parse_isolation("t", "isolation", isolation.NVIDIA_MPS)

    def caps(item: Allocated) -> isolation.ShareEdits:
        return isolation.compute(profile, {"n": 100, "k": item.shares, "card_memory_mib": 40000,
                                           "percent": item.shares, "shadow_dir": "/run/iso/n_gpu-0"}, "t")

    doc = spec([Allocated("gpu", f"gpu-{NODE}-0", card(0), dra.ROLE_SHARE, 25)], caps=caps)
    jsonschema.validate(doc, CDI_SCHEMA)
    check_spec(doc)
    edits = doc["devices"][0]["containerEdits"]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10000M" in edits["env"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in edits["env"]
    assert {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}["/tmp/nvidia-mps"] == "/run/iso/n_gpu-0/pipe"


def test_an_unknown_vendor_is_refused() -> None:
    other = card(0)
    item = Allocated("gpu", other.name, type(other)(other.id, "x.com/npu", 0, True), dra.ROLE_SHARE, 10)
    with pytest.raises(CdiSpecError, match=r"x\.com/npu is not in the vendor table"):
        spec([item])


def _good() -> dict[str, Any]:
    return spec([Allocated("gpu", f"gpu-{NODE}-0", card(0), dra.ROLE_SPOT, 100)])


@pytest.mark.parametrize("change, field", [
    (lambda d: d.update(cdiVersion="9.9.9"), "spec"),
    (lambda d: d.update(extra=1), "spec.extra"),
    (lambda d: d.update(devices=[]), "spec.devices"),
    (lambda d: d["devices"][0].update(name="bad/name"), "devices[0].name"),
    (lambda d: d["devices"].append(dict(d["devices"][0])), "devices[1].name"),
    (lambda d: d["devices"][0].update(containerEdits={}), "devices[0].containerEdits"),
    (lambda d: d["devices"][0]["containerEdits"].update(hooks=[]), "containerEdits.hooks"),
    (lambda d: d["devices"][0]["containerEdits"]["deviceNodes"][0].update(path="dev/x"), "deviceNodes[0].path"),
    (lambda d: d["devices"][0]["containerEdits"]["deviceNodes"][0].update(major="195"), "deviceNodes[0].major"),
    (lambda d: d["devices"][0]["containerEdits"]["deviceNodes"][0].update(colour=1), "deviceNodes[0].colour"),
    (lambda d: d["containerEdits"].update(env=["NOVALUE"]), "containerEdits.env[0]"),
    (lambda d: d["containerEdits"]["mounts"][0].update(containerPath="/a/../b"), "mounts[0].containerPath"),
    (lambda d: d["containerEdits"]["mounts"][0].pop("hostPath"), "mounts[0].hostPath"),
])
def test_the_strict_check_refuses_what_the_schema_refuses(change: Any, field: str) -> None:
    doc = _good()
    check_spec(doc)
    change(doc)
    with pytest.raises(CdiSpecError) as caught:
        check_spec(doc)
    assert field in caught.value.field


def test_default_vendor_table_writes_a_loadable_spec() -> None:
    doc = claim_spec(UID, [Allocated("gpu", "gpu-x", card(2), dra.ROLE_EXCLUSIVE, 100)],
                     DEFAULT_VENDORS, "", lambda path: False, no_caps)
    jsonschema.validate(doc, CDI_SCHEMA)
    check_spec(doc)
    assert doc["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia2"}]


@pytest.mark.parametrize("annotations", [
    {"gpushare.k8s.io/prepared-claim": 1},
    {"no spaces allowed": "x"},
    ["gpushare.k8s.io/prepared-claim"],
    {"-leading.dash/x": "y"},
])
def test_spec_annotations_must_be_qualified_names_to_strings(annotations: object) -> None:
    from gpushare_dra_driver.cdi import CdiSpecError, check_spec

    spec = {"cdiVersion": "0.6.0", "kind": "gpushare.k8s.io/gpu", "annotations": annotations,
            "devices": [{"name": "share.x.GPU-0", "containerEdits": {"env": ["A=1"]}}]}
    with pytest.raises(CdiSpecError, match=r"spec\.annotations"):
        check_spec(spec)
    spec["annotations"] = {"gpushare.k8s.io/prepared-claim": "{}"}
    check_spec(spec)
