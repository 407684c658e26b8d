"""Reading a claim's allocation: roles, shares, and every way it can be wrong."""

from __future__ import annotations

from typing import Any

import pytest
from gpushare_common import dra
from gpushare_dra_driver.claims import ClaimError, ClaimRef, allocated

from tests.dra.builders import NODE, card, claim, devices, result

CARDS = [card(0), card(1)]
INDEX = devices(CARDS)


def read(body: dict[str, Any], uid: str = "") -> list[Any]:
    meta = body["metadata"]
    ref = ClaimRef(meta["namespace"], meta["name"], uid or meta["uid"])
    return allocated(body, ref, dra.DRIVER, NODE, INDEX, 100)


def test_a_share_of_one_card() -> None:
    (found,) = read(claim(results=[result(f"gpu-{NODE}-0", "25")]))
    assert (found.request, found.device, found.card.id, found.role, found.shares) == \
        ("gpu", f"gpu-{NODE}-0", f"GPU-{NODE}-0", dra.ROLE_SHARE, 25)


def test_roles_follow_the_device_class_then_the_shares() -> None:
    requests = [{"name": "whole", "exactly": {"deviceClassName": dra.EXCLUSIVE_CLASS}},
                {"name": "odd", "exactly": {"deviceClassName": "other.example.com"}},
                {"name": "pick", "firstAvailable": [{"name": "a", "deviceClassName": dra.SHARE_CLASS}]}]
    body = claim(requests=requests, results=[
        result(f"gpu-{NODE}-0", "100", "whole"), result(f"gpu-{NODE}-1", None, "odd"),
        result(f"gpu-{NODE}-1", "10", "pick/a"), result(f"spot-gpu-{NODE}-1", None, "odd"),
        result("other-device", "5", driver="other.example.com")])
    assert [(f.request, f.role, f.shares) for f in read(body)] == [
        ("whole", "exclusive", 100), ("odd", "exclusive", 100), ("pick/a", "share", 10), ("odd", "spot", 100)]


@pytest.mark.parametrize("body, field, reason", [
    (claim(), "status.allocation", "not allocated"),
    (claim(results=[result("gpu-unknown")]), "results[0].device", "unknown device 'gpu-unknown'"),
    (claim(results=[result(f"gpu-{NODE}-0", pool="gpu-node-8")]), "results[0].pool", "not this node's pool"),
    (claim(results=[result(f"gpu-{NODE}-0", "125")]), "consumedCapacity.shares", "outside [1, 100]"),
    (claim(results=[result(f"gpu-{NODE}-0", "0")]), "consumedCapacity.shares", "outside [1, 100]"),
    (claim(results=[result(f"gpu-{NODE}-0", "2.5")]), "consumedCapacity.shares", "whole number"),
    (claim(results=[result(f"spot-gpu-{NODE}-0", "25")]), "consumedCapacity", "spot device has no shares"),
    (claim(results=[result("x", driver="other.example.com")]), "results", "no device of driver"),
    (claim(results=["not an object"]), "results[0]", "expected an object"),
    ({**claim(), "status": {"allocation": {"devices": {"results": "x"}}}}, "results", "expected a list"),
])
def test_malformed_allocations_name_the_claim_and_field(body: dict[str, Any], field: str, reason: str) -> None:
    with pytest.raises(ClaimError, match="claim ml/c1") as caught:
        read(body)
    assert field in caught.value.field and reason in caught.value.reason


def test_a_claim_recreated_under_the_same_name_is_not_the_one_asked_for() -> None:
    with pytest.raises(ClaimError, match="deleted and created again"):
        read(claim(results=[result(f"gpu-{NODE}-0")]), uid="5e0d0d1c-0000-4000-8000-000000000000")
