"""The spec transformation, table-driven, and its idempotence as a property."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from gpushare_runtime.config import DEFAULT_VENDORS, RuntimeConfig, VendorResource
from gpushare_runtime.edits import DeviceEdits, apply_edits, edits_from_source, merge_values
from hypothesis import given, settings
from hypothesis import strategies as st

from .builders import allow, gpu_device, spec

VISIBLE = RuntimeConfig().visible_env
NVIDIA = DEFAULT_VENDORS["nvidia.com/gpu"]
FUSE = gpu_device("/dev/fuse", 10, 229)


def transformed(target: dict[str, Any], source: dict[str, Any],
                vendors: list[VendorResource] | None = None) -> dict[str, Any]:
    return apply_edits(target, edits_from_source(source, vendors, VISIBLE))


def env_of(result: dict[str, Any], name: str) -> list[str]:
    return [e for e in result["process"]["env"] if e.startswith(name + "=")]


CASES = [
    pytest.param(
        spec(), spec(devices=[gpu_device()]),
        {"devices": ["/dev/nvidia0"], "rules": [allow(195, 0)]}, id="one-device",
    ),
    pytest.param(
        spec(devices=[gpu_device()]), spec(devices=[gpu_device(), gpu_device("/dev/nvidia1", 195, 1)]),
        {"devices": ["/dev/nvidia0", "/dev/nvidia1"]}, id="dedup-by-path",
    ),
    pytest.param(
        spec(env=["NVIDIA_VISIBLE_DEVICES=void"]),
        spec(devices=[gpu_device()], env=["NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b"]),
        {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b"]}, id="void-gives-way",
    ),
    pytest.param(
        spec(env=["NVIDIA_VISIBLE_DEVICES=GPU-b"]),
        spec(devices=[gpu_device()], env=["NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b"]),
        {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-b,GPU-a"]}, id="env-merged-no-duplicates",
    ),
    pytest.param(
        spec(), spec(devices=[gpu_device()], env=["HIP_VISIBLE_DEVICES=0", "OTHER=x"]),
        {"env": ["HIP_VISIBLE_DEVICES=0"], "no_env": ["OTHER"]}, id="only-visible-vars",
    ),
    pytest.param(
        spec(), spec(devices=[gpu_device(), FUSE]),
        {"devices": ["/dev/nvidia0", "/dev/fuse"]}, id="star-copies-every-device",
    ),
]


@pytest.mark.parametrize(("target", "source", "expected"), CASES)
def test_copy_from_source(target: dict[str, Any], source: dict[str, Any],
                          expected: dict[str, Any]) -> None:
    result = transformed(target, source)
    if "devices" in expected:
        assert [d["path"] for d in result["linux"]["devices"]] == expected["devices"]
    for rule in expected.get("rules", []):
        assert rule in result["linux"]["resources"]["devices"]
    for entry in expected.get("env", []):
        assert env_of(result, entry.partition("=")[0]) == [entry]
    for name in expected.get("no_env", []):
        assert env_of(result, name) == []


def test_resource_selection_copies_only_that_vendor() -> None:
    source = spec(devices=[gpu_device(), FUSE, gpu_device("/dev/nvidiactl", 195, 255)])
    result = transformed(spec(), source, [NVIDIA])
    assert [d["path"] for d in result["linux"]["devices"]] == ["/dev/nvidia0", "/dev/nvidiactl"]


def test_source_rule_is_kept_and_deny_rule_stays_first() -> None:
    source = spec(devices=[gpu_device()])
    source["linux"]["resources"]["devices"][-1]["access"] = "rw"
    result = transformed(spec(), source)
    rules = result["linux"]["resources"]["devices"]
    assert rules[0] == {"allow": False, "access": "rwm"}
    assert rules[-1] == {**allow(195, 0), "access": "rw"}


def test_vendor_mounts_copied_others_not() -> None:
    mount = {"destination": "/usr/bin/nvidia-smi", "source": "/usr/bin/nvidia-smi",
             "type": "bind", "options": ["ro", "bind"]}
    vendor = VendorResource("nvidia.com/gpu", NVIDIA.env, NVIDIA.device_nodes, (mount,))
    source = spec(devices=[gpu_device()])
    source["mounts"] += [mount, {"destination": "/data", "source": "/srv", "type": "bind"}]
    result = transformed(spec(), source, [vendor])
    destinations = [m["destination"] for m in result["mounts"]]
    assert "/usr/bin/nvidia-smi" in destinations
    assert "/data" not in destinations


def test_nothing_else_changes() -> None:
    target = spec(annotations={"a": "b"}, env=["X=1"])
    result = transformed(target, spec(devices=[gpu_device()], env=["NVIDIA_VISIBLE_DEVICES=0"]))
    for key in set(target) | set(result):
        if key not in ("linux", "process"):
            assert result.get(key) == target.get(key)
    for key in set(target["linux"]) - {"devices", "resources"}:
        assert result["linux"][key] == target["linux"][key]
    assert {k: v for k, v in result["process"].items() if k != "env"} == {
        k: v for k, v in target["process"].items() if k != "env"
    }


def test_apply_does_not_mutate_input() -> None:
    target = spec()
    before = copy.deepcopy(target)
    transformed(target, spec(devices=[gpu_device()]))
    assert target == before


def test_empty_edits_are_falsy() -> None:
    assert not DeviceEdits()
    assert not edits_from_source(spec(), None, VISIBLE)


def test_merge_values_all_wins() -> None:
    assert merge_values(["0"], ["all", "1"]) == ["all"]
    assert merge_values(["none"], []) == []


device_numbers = st.tuples(st.integers(0, 300), st.integers(0, 300))
device_lists = st.lists(
    st.builds(lambda n, mm: gpu_device(f"/dev/nvidia{n}", *mm), st.integers(0, 8), device_numbers),
    max_size=5,
)
visible_values = st.lists(st.sampled_from(["0", "1", "GPU-a", "void", "all", "none"]), max_size=4)


@settings(max_examples=60, deadline=None)
@given(device_lists, device_lists, visible_values, visible_values)
def test_applying_twice_equals_once(target_devices: list[dict[str, Any]],
                                    source_devices: list[dict[str, Any]],
                                    target_env: list[str], source_env: list[str]) -> None:
    target = spec(devices=target_devices, env=[f"NVIDIA_VISIBLE_DEVICES={','.join(target_env)}"])
    source = spec(devices=source_devices, env=[f"NVIDIA_VISIBLE_DEVICES={','.join(source_env)}"])
    edits = edits_from_source(source, None, VISIBLE)
    once = apply_edits(target, edits)
    assert apply_edits(once, edits) == once
    paths = [d["path"] for d in once["linux"].get("devices", [])]
    assert set(paths) >= {d["path"] for d in source_devices}
