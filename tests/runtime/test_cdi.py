"""CDI specs applied completely: every edit the specification defines, in its merge order, or a
clear refusal naming the file, the device and the field."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from gpushare_runtime import miniyaml
from gpushare_runtime.cdi import CdiRegistry
from gpushare_runtime.edits import DeviceEdits, apply_edits
from gpushare_runtime.errors import CdiError

from .builders import spec
from .cdi_fixtures import (
    CDI_SCHEMA,
    LIBS,
    NVIDIA_NODES,
    host_nodes,
    minimal,
    nvidia_yaml,
    resctrl_and_gids,
    spec_example,
)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of device nodes needs root")


def registry_with(directory: Path, docs: dict[str, Any]) -> CdiRegistry:
    directory.mkdir(parents=True, exist_ok=True)
    for name, doc in docs.items():
        (directory / name).write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return CdiRegistry((str(directory),))


def resolved(registry: CdiRegistry, resource: str, *names: str,
             user: tuple[int, int] = (0, 0)) -> DeviceEdits:
    total, seen = DeviceEdits(), set[str]()
    for name in names:
        found = registry.resolve(resource, name, user, seen)
        assert found is not None, name
        total.update(found)
    return total


@needs_root
def test_fixtures_are_cdi_specs(tmp_path: Path) -> None:
    for doc in (spec_example(tmp_path), minimal(), resctrl_and_gids(),
                yaml.safe_load(nvidia_yaml(tmp_path))):
        jsonschema.validate(doc, CDI_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**minimal(), "unknown": 1}, CDI_SCHEMA)


@needs_root
def test_spec_example_shape_applied(tmp_path: Path) -> None:
    root = host_nodes(tmp_path / "root", {"/dev/card1": (240, 1), "/dev/vendorctl": (240, 0)})
    edits = resolved(registry_with(tmp_path / "cdi", {"v.json": spec_example(root)}),
                     "vendor.com/device", "myDevice")
    result = apply_edits(spec(env=["BAR=old"]), edits)
    env = result["process"]["env"]
    assert "FOO=CDI_SPEC" in env and "BAR=BARVALUE1" in env and "BAR=old" not in env
    devices = {d["path"]: d for d in result["linux"]["devices"]}
    assert devices["/dev/vendorctl"] == {"path": "/dev/vendorctl", "type": "c", "major": 240,
                                         "minor": 0, "fileMode": 0o660, "uid": 1000, "gid": 1000}
    assert (devices["/dev/card1"]["major"], devices["/dev/card1"]["minor"]) == (240, 1)
    assert devices["/dev/card2"] == {"path": "/dev/card2", "type": "c", "major": 240, "minor": 2}
    rules = result["linux"]["resources"]["devices"]
    for minor in (0, 1, 2):
        assert {"allow": True, "type": "c", "major": 240, "minor": minor, "access": "rwm"} in rules
    assert {"destination": "/bin/vendorBin", "source": "/bin/vendorBin"} in result["mounts"]
    assert result["hooks"] == {"createContainer": [{"path": "/bin/vendor-hook"}],
                               "startContainer": [{"path": "/usr/bin/ldconfig"}]}


@needs_root
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_nvidia_generated_spec(tmp_path: Path, suffix: str) -> None:
    root = host_nodes(tmp_path / "driver", NVIDIA_NODES)
    text = nvidia_yaml(root)
    docs = {"nvidia" + suffix: text if suffix == ".yaml" else yaml.safe_load(text)}
    edits = resolved(registry_with(tmp_path / "cdi", docs), "nvidia.com/gpu", "0", "1")
    result = apply_edits(spec(env=["NVIDIA_VISIBLE_DEVICES=all"]), edits)
    assert "NVIDIA_VISIBLE_DEVICES=void" in result["process"]["env"]
    added = {d["path"]: (d["major"], d["minor"]) for d in result["linux"]["devices"]}
    assert {p: added[p] for p in NVIDIA_NODES} == NVIDIA_NODES
    hooks = result["hooks"]["createContainer"]
    assert [h["args"][1] for h in hooks] == ["create-symlinks", "update-ldcache", "create-symlinks"]
    assert hooks[1] == {"path": "/usr/bin/nvidia-cdi-hook",
                        "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", LIBS]}
    libcuda = next(m for m in result["mounts"] if m["destination"].endswith("libcuda.so.550.54.15"))
    assert libcuda == {"destination": f"{LIBS}/libcuda.so.550.54.15",
                       "source": f"{root}{LIBS}/libcuda.so.550.54.15",
                       "options": ["ro", "nosuid", "nodev", "bind"]}
    assert apply_edits(result, edits) == result  # idempotent: no hook, mount or node twice


def test_spec_edits_come_first_and_once_per_spec(tmp_path: Path) -> None:
    doc = {"cdiVersion": "0.3.0", "kind": "vendor.com/x",
           "containerEdits": {"env": ["WHO=spec", "SPEC=1"]},
           "devices": [{"name": "a", "containerEdits": {"env": ["WHO=a"]}},
                       {"name": "b", "containerEdits": {"env": ["B=1"]}}]}
    registry = registry_with(tmp_path, {"x.json": doc})
    edits = resolved(registry, "vendor.com/x", "a", "b")
    assert edits.fixed_env == {"SPEC": "1", "WHO": "a", "B": "1"}
    assert resolved(registry, "vendor.com/x", "b").fixed_env == {"WHO": "spec", "SPEC": "1", "B": "1"}


def test_resctrl_and_additional_gids(tmp_path: Path) -> None:
    edits = resolved(registry_with(tmp_path, {"r.json": resctrl_and_gids()}), "vendor.com/rdt", "0")
    base = spec()
    base["process"]["user"]["additionalGids"] = [107]
    result = apply_edits(base, edits)
    assert result["process"]["user"]["additionalGids"] == [107, 44]
    assert result["linux"]["intelRdt"] == {"closID": "gpushare", "l3CacheSchema": "L3:0=f",
                                           "schemata": ["MB:0=50"], "enableMonitoring": True}


def node_doc(**node: Any) -> dict[str, Any]:
    return {"cdiVersion": "0.5.0", "kind": "vendor.com/n",
            "devices": [{"name": "d", "containerEdits": {"deviceNodes": [node]}}]}


@needs_root
@pytest.mark.parametrize(("node", "user", "device", "access"), [
    ({}, (0, 0), {"type": "c", "major": 240, "minor": 9, "fileMode": 0o660}, "rwm"),
    ({"permissions": "rw"}, (0, 0), {}, "rw"),
    ({"permissions": "none"}, (0, 0), {}, ""),
    ({}, (1000, 100), {"uid": 1000, "gid": 100}, "rwm"),
    ({"uid": 0, "fileMode": 0o600}, (1000, 100), {"uid": 0, "gid": 100, "fileMode": 0o600}, "rwm"),
    ({"type": "c", "major": 241, "minor": 3}, (0, 0), {"major": 241, "minor": 3}, "rwm"),
])
def test_device_node_defaults(tmp_path: Path, node: dict[str, Any], user: tuple[int, int],
                              device: dict[str, Any], access: str) -> None:
    host_nodes(tmp_path / "root", {"/dev/n9": (240, 9)})
    doc = node_doc(path="/dev/n9", hostPath=f"{tmp_path}/root/dev/n9", **node)
    edits = resolved(registry_with(tmp_path / "cdi", {"n.json": doc}), "vendor.com/n", "d", user=user)
    (added,) = edits.devices
    assert {k: added[k] for k in device} == device
    assert edits.rules == [{"allow": True, "type": "c", "major": added["major"],
                            "minor": added["minor"], "access": access}]


def test_minimal_node_needs_no_host_node_and_fifo_gets_no_rule(tmp_path: Path) -> None:
    doc = {"cdiVersion": "0.5.0", "kind": "vendor.com/n", "devices": [{"name": "d", "containerEdits": {
        "deviceNodes": [{"path": "/dev/absent", "type": "b", "major": 8, "minor": 1},
                        {"path": "/dev/pipe", "hostPath": "/nonexistent", "type": "p"}]}}]}
    edits = resolved(registry_with(tmp_path, {"n.json": doc}), "vendor.com/n", "d")
    assert [d["path"] for d in edits.devices] == ["/dev/absent", "/dev/pipe"]
    assert edits.rules == [{"allow": True, "type": "b", "major": 8, "minor": 1, "access": "rwm"}]


def edits_doc(edits: dict[str, Any], version: str = "1.1.0", **device: Any) -> dict[str, Any]:
    return {"cdiVersion": version, "kind": "vendor.com/bad",
            "devices": [{"name": "d1", "containerEdits": edits, **device}]}


REFUSED = [
    (edits_doc({"hooks": [{"hookName": "preStart", "path": "/bin/x"}]}), "'d1' containerEdits.hooks[0].hookName"),
    (edits_doc({"hooks": [{"hookName": "poststop", "path": "bin/x"}]}), "hooks[0].path: must be absolute"),
    (edits_doc({"hooks": [{"hookName": "poststop", "path": "/x", "timeout": 0}]}), "hooks[0].timeout"),
    (edits_doc({"netDevices": [{"hostInterfaceName": "eth1", "name": "eth1"}]}), "netDevices: not supported"),
    (edits_doc({"env": ["=x"]}), "containerEdits.env: '=x' is not NAME=value"),
    (edits_doc({"deviceNodes": [{"path": "/dev/x", "type": "c", "major": 1, "permissions": "rwx"}]}),
     "deviceNodes[0].permissions"),
    (edits_doc({"deviceNodes": [{"path": "/dev/nothing-here"}]}), "deviceNodes[0]: host device"),
    (edits_doc({"deviceNodes": [{"path": "/dev/null", "type": "b"}]}), "deviceNodes[0].type: 'b' but"),
    (edits_doc({"deviceNodes": [{"path": "/dev/x", "type": "c", "major": 1, "owner": 0}]}),
     "deviceNodes[0].owner: not a field"),
    (edits_doc({"mounts": [{"hostPath": "/a"}]}), "mounts[0].containerPath"),
    (edits_doc({"intelRdt": {"closID": ".."}}), "intelRdt.closID"),
    (edits_doc({"intelRdt": {"enableCMT": True}}), "intelRdt.enableCMT: not a field"),
    (edits_doc({"additionalGids": [-1]}), "additionalGids[0]"),
    (edits_doc({"cgroupRules": []}), "containerEdits.cgroupRules: not a field"),
    (edits_doc({"env": ["A=1"]}, extra=1), "device 'd1': extra: not a field"),
    (edits_doc({}), "device 'd1': containerEdits: a device needs edits"),
    ({**edits_doc({"env": ["A=1"]}), "vendorExtension": {}}, "vendorExtension: not a field"),
    (edits_doc({"env": ["A=1"]}, version="2.0.0"), "cdiVersion '2.0.0' is not one this runtime knows"),
    (edits_doc({"additionalGids": [5]}, version="0.6.0"), "intelRdt/additionalGids needs cdiVersion 0.7.0"),
    (edits_doc({"mounts": [{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]}, version="0.3.0"),
     "mounts.type needs cdiVersion 0.4.0"),
]


@pytest.mark.parametrize(("doc", "reason"), REFUSED)
def test_unsupported_or_invalid_edits_are_refused_by_name(tmp_path: Path, doc: dict[str, Any],
                                                         reason: str) -> None:
    registry = registry_with(tmp_path, {"bad.json": doc})
    with pytest.raises(CdiError) as caught:
        registry.resolve("vendor.com/bad", "d1")
    assert str(tmp_path / "bad.json") in str(caught.value) and reason in str(caught.value)


def test_directories_override_and_duplicates_conflict(tmp_path: Path) -> None:
    first, second = tmp_path / "etc", tmp_path / "run"
    registry_with(first, {"a.json": edits_doc({"env": ["FROM=etc"]})})
    registry_with(second, {"b.json": edits_doc({"env": ["FROM=run"]})})
    registry = CdiRegistry((str(first), str(second)))
    assert resolved(registry, "vendor.com/bad", "d1").fixed_env == {"FROM": "run"}
    registry_with(second, {"c.json": edits_doc({"env": ["FROM=again"]})})
    with pytest.raises(CdiError, match="defined twice"):
        CdiRegistry((str(first), str(second))).resolve("vendor.com/bad", "d1")


@pytest.mark.parametrize(("text", "reason"), [
    ("cdiVersion: 0.5.0\nkind: &k vendor.com/y\n", "line 2: unsupported YAML: '&k"),
    ("cdiVersion: 0.5.0\nkind: vendor.com/y\n---\nkind: other\n", "line 3: unsupported YAML: '---'"),
    ("cdiVersion: 0.5.0\nkind: !!str vendor.com/y\n", "line 2: unsupported YAML: '!!str"),
    ("cdiVersion: 0.5.0\nkind: vendor.com/y\ndevices:\n- name: *anchor\n", "line 4: unsupported YAML"),
])
def test_unsupported_yaml_is_refused_clearly(tmp_path: Path, text: str, reason: str) -> None:
    registry = registry_with(tmp_path, {"y.yaml": text})
    assert registry.resolve("vendor.com/y", "0") is None
    (note,) = registry.unreadable
    assert str(tmp_path / "y.yaml") in note and reason in note


def test_yaml_integers_as_yaml_reads_them() -> None:
    text = "a: 0666\nb: 0o17\nc: 0x1f\nd: 08\ne: -12\nf: '0666'\n"
    assert miniyaml.loads(text) == yaml.safe_load(text.replace("0o17", "15")) | {"b": 15}
