"""The sim scheduler's DRA allocation: capacity, allowMultipleAllocations, taints, constraints."""

from __future__ import annotations

from typing import Any

import pytest
from gpushare_common import dra
from gpushare_sim.dra.allocator import AllocationError, read_slices, usage
from gpushare_sim.dra.search import allocate

Obj = dict[str, Any]
NODE = "n1"
CLASSES = {name: dra.device_class(name) for name in dra.DEVICE_CLASSES}


def card(name: str, root: str, multiple: bool = True, taints: list[Obj] | None = None) -> Obj:
    device: Obj = {"name": name, "attributes": {"kind": {"string": "card"}, dra.PCIE_ROOT: {"string": root}}}
    if multiple:
        device["capacity"] = {dra.SHARES: {"value": "100", "requestPolicy": dra.share_policy(100)}}
        device["allowMultipleAllocations"] = True
    if taints:
        device["taints"] = taints
    return device


def slice_(devices: list[Obj], generation: int = 1, name: str = "s") -> Obj:
    return {"metadata": {"name": name}, "spec": {"driver": dra.DRIVER, "nodeName": NODE, "devices": devices,
                                                 "pool": {"name": NODE, "generation": generation,
                                                          "resourceSliceCount": 1}}}


SLICES = [slice_([card("gpu-0", "pci0000:00"), card("gpu-1", "pci0000:00"), card("gpu-2", "pci0000:80"),
                  {"name": "spot-gpu-3", "attributes": {"kind": {"string": "spot"}}}])]


def claim(*requests: Obj, constraints: list[Obj] | None = None, uid: str = "u") -> Obj:
    devices: Obj = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    return {"metadata": {"name": "c", "namespace": "ml", "uid": uid}, "spec": {"devices": devices}}


def share(shares: str | None = "25", count: int = 1, name: str = "gpu", **extra: Any) -> Obj:
    exactly: Obj = {"deviceClassName": dra.SHARE_CLASS, "count": count, **extra}
    if shares is not None:
        exactly["capacity"] = {"requests": {dra.SHARES: shares}}
    return {"name": name, "exactly": exactly}


def run(body: Obj, allocated: list[Obj] | None = None, rules: list[Obj] | None = None,
        slices: list[Obj] | None = None) -> list[Obj]:
    return allocate(body, CLASSES, read_slices(slices or SLICES), usage(allocated or []), rules or [])


def allocated_claim(results: list[Obj], uid: str) -> Obj:
    return {"metadata": {"uid": uid}, "status": {"allocation": {"devices": {"results": results}}}}


def test_four_quarters_fill_a_card_before_the_next() -> None:
    done: list[Obj] = []
    for index in range(5):
        results = run(claim(share()), done)
        done.append(allocated_claim(results, str(index)))
        assert results[0]["consumedCapacity"] == {dra.SHARES: "25"} and results[0]["shareID"]
    assert [c["status"]["allocation"]["devices"]["results"][0]["device"] for c in done] == \
        ["gpu-0"] * 4 + ["gpu-1"]


def test_no_capacity_asked_means_the_whole_card_and_policy_rounds() -> None:
    (whole,) = run(claim({"name": "gpu", "exactly": {"deviceClassName": dra.EXCLUSIVE_CLASS}}))
    assert whole["consumedCapacity"] == {dra.SHARES: "100"}
    with pytest.raises(AllocationError, match="no devices satisfy"):
        run(claim(share("101")))
    (zero,) = run(claim(share("0")))
    assert zero["consumedCapacity"] == {dra.SHARES: "1"}  # the policy's minimum


def test_a_device_without_multiple_allocations_goes_to_one_claim() -> None:
    spot = {"name": "gpu", "exactly": {"deviceClassName": dra.SPOT_CLASS}}
    (first,) = run(claim(spot))
    assert first["device"] == "spot-gpu-3" and "consumedCapacity" not in first
    with pytest.raises(AllocationError):
        run(claim(spot), [allocated_claim([first], "a")])


def test_taints_keep_devices_away_unless_tolerated() -> None:
    slices = [slice_([card("gpu-0", "r", taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}]),
                      card("gpu-1", "r")])]
    assert run(claim(share()), slices=slices)[0]["device"] == "gpu-1"
    tolerant = share(tolerations=[{"key": "k", "operator": "Exists"}])
    assert run(claim(tolerant), slices=slices)[0]["device"] == "gpu-0"
    rule = {"spec": {"deviceSelector": {"driver": dra.DRIVER, "pool": NODE, "device": "gpu-1"},
                     "taint": {"key": "owner-back", "value": "x", "effect": "NoExecute"}}}
    with pytest.raises(AllocationError):
        run(claim(share()), slices=slices, rules=[rule])
    soft = {"spec": {"deviceSelector": {"device": "gpu-1"}, "taint": {"key": "a", "effect": "PreferNoSchedule"}}}
    assert run(claim(share()), slices=slices, rules=[soft])[0]["device"] == "gpu-1"


def test_match_attribute_puts_two_cards_under_one_pcie_root() -> None:
    used = [allocated_claim([{"driver": dra.DRIVER, "pool": NODE, "device": "gpu-0",
                              "consumedCapacity": {dra.SHARES: "100"}}], "x")]
    two = claim(share(None, count=2), constraints=[{"matchAttribute": dra.PCIE_ROOT}])
    with pytest.raises(AllocationError):  # gpu-0 is taken: gpu-1 and gpu-2 sit under different roots
        run(two, used)
    assert sorted(r["device"] for r in run(two)) == ["gpu-0", "gpu-1"]
    apart = claim(share(None, name="a"), share(None, name="b"), constraints=[
        {"requests": ["a", "b"], "matchAttribute": dra.PCIE_ROOT}])
    assert [(r["request"], r["device"]) for r in run(apart)] == [("a", "gpu-0"), ("b", "gpu-1")]
    with pytest.raises(AllocationError):  # a takes gpu-1 whole; nothing else is left under its root
        run(apart, used)


def test_all_mode_and_first_available() -> None:
    every = claim({"name": "gpu", "exactly": {"deviceClassName": dra.EXCLUSIVE_CLASS, "allocationMode": "All"}})
    assert sorted(r["device"] for r in run(every)) == ["gpu-0", "gpu-1", "gpu-2"]
    pick = claim({"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": dra.SHARE_CLASS, "capacity": {"requests": {dra.SHARES: "200"}}},
        {"name": "small", "deviceClassName": dra.SHARE_CLASS, "capacity": {"requests": {dra.SHARES: "10"}}}]})
    assert [r["request"] for r in run(pick)] == ["gpu/small"]


def test_selectors_read_capacity_as_quantities_and_versions_as_semver() -> None:
    small = card("gpu-0", "r")
    small["capacity"] = {dra.SHARES: {"value": "50"}}
    small["attributes"]["driverVersion"] = {"version": "1.10.0"}
    big = card("gpu-1", "r")
    big["attributes"]["driverVersion"] = {"version": "1.9.3"}
    slices = [slice_([small, big])]
    roomy = 'device.capacity["gpushare.k8s.io"].shares.compareTo(quantity("80")) >= 0'
    assert run(claim(share(None, selectors=[{"cel": {"expression": roomy}}])), slices=slices)[0]["device"] == "gpu-1"
    recent = 'device.attributes["gpushare.k8s.io"].driverVersion.isGreaterThan(semver("1.9.10"))'  # not as text
    assert run(claim(share(None, selectors=[{"cel": {"expression": recent}}])), slices=slices)[0]["device"] == "gpu-0"
    with pytest.raises(AllocationError, match="no devices satisfy"):
        run(claim(share(None, selectors=[{"cel": {"expression": f"{roomy} && {recent}"}}])), slices=slices)


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    old = slice_([card("gpu-9", "r")], generation=1, name="a")
    new = slice_([card("gpu-0", "r")], generation=2, name="b")
    assert [d.name for d in read_slices([old, new])] == ["gpu-0"]


@pytest.mark.parametrize("request_, reason", [
    ({"name": "gpu", "exactly": {"deviceClassName": "nope.example.com"}}, "DeviceClass 'nope.example.com' not found"),
    ({"name": "gpu", "exactly": {"deviceClassName": dra.SHARE_CLASS, "adminAccess": True}}, "adminAccess"),
    ({"name": "gpu", "exactly": {"deviceClassName": dra.SHARE_CLASS, "allocationMode": "Some"}}, "allocationMode"),
    ({"name": "gpu", "exactly": {"deviceClassName": dra.SHARE_CLASS,
                                 "selectors": [{"cel": {"expression": "request.name == 'x'"}}]}},
     "undeclared reference to 'request'"),
    ({"name": "gpu"}, "exactly or firstAvailable is required"),
    ({"name": "gpu", "exactly": {"deviceClassName": dra.SHARE_CLASS,
                                 "capacity": {"requests": {dra.SHARES: "2.5"}}}}, "capacity.requests"),
])
def test_unsupported_or_malformed_requests_say_why(request_: Obj, reason: str) -> None:
    with pytest.raises(AllocationError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        run(claim(request_))
    with pytest.raises(AllocationError, match="matchAttribute"):
        run(claim(share(), constraints=[{"matchAttribute": "pcieRoot"}]))
