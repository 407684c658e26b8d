"""gpushare_common.dra: DRA device names, CDI device names, consumable-capacity arithmetic."""

from __future__ import annotations

import string

import pytest
from gpushare_common import dra
from hypothesis import given
from hypothesis import strategies as st

UID = "0b6c8a5e-7f4a-4c0e-9a31-5d2f3b1e9c77"
CARD_IDS = st.text(string.ascii_letters + string.digits + "-_.:", min_size=1, max_size=80).filter(
    lambda s: s[0].isalnum() and s[-1].isalnum())


@given(CARD_IDS)
def test_device_names_are_dns_labels_with_room_for_the_spot_prefix(card: str) -> None:
    name = dra.device_name(card)
    assert dra.is_dns_label(name) and len(name) <= dra.MAX_CARD_NAME
    assert dra.is_dns_label(dra.spot_device_name(card)) and dra.device_name(card) == name


def test_device_names_read_like_the_vendor_id() -> None:
    assert dra.device_name("GPU-8a1b2c3d-0000-1111-2222-333344445555") == "gpu-8a1b2c3d-0000-1111-2222-333344445555"
    assert dra.device_name("0000:3b:00.0") == "0000-3b-00-0"
    assert dra.spot_device_name("GPU-node-1-0") == "spot-gpu-node-1-0"
    assert dra.device_name("x" * 70).startswith("gpu-")
    with pytest.raises(dra.DraNameError):
        dra.device_name("")


@given(st.sampled_from(dra.ROLES), st.uuids(), CARD_IDS)
def test_cdi_devices_round_trip(role: str, uid: object, card: str) -> None:
    device = dra.cdi_device(role, str(uid), card)
    assert dra.valid_cdi_name(device.name)
    assert dra.parse_cdi_device(device.qualified) == device == dra.parse_cdi_device(device.name)
    assert dra.is_ours(device.qualified)


@pytest.mark.parametrize("value, what", [
    ("nvidia.com/gpu=share.x.y", "not of kind"),
    (f"{dra.CDI_KIND}=share.{UID}", "expected <role>.<claim uid>.<card>"),
    (f"{dra.CDI_KIND}=borrow.{UID}.GPU-0", "expected one of"),
    (f"{dra.CDI_KIND}=spot.not_a_uid.GPU-0", "expected a UUID"),
    (f"{dra.CDI_KIND}=spot.{UID}.GPU/0", "cannot be part of a CDI device name"),
    (7, "expected a string"),
])
def test_malformed_cdi_devices_say_why(value: object, what: str) -> None:
    with pytest.raises(dra.DraNameError, match=what):
        dra.parse_cdi_device(value)


@given(st.text(max_size=40))
def test_parsing_any_text_gives_a_device_or_a_name_error(text: str) -> None:
    try:
        dra.parse_cdi_device(text)
    except dra.DraNameError:
        pass


POLICY = dra.share_policy(100)


@pytest.mark.parametrize("requested, expected", [
    (None, 100), (25, 25), (1, 1), (100, 100), (0, 1), (101, None), (250, None)])
def test_shares_consumed_under_the_card_policy(requested: int | None, expected: int | None) -> None:
    assert dra.consumed(requested, 100, POLICY) == expected


def test_step_rounds_up_and_max_bounds() -> None:
    policy = {"default": "10", "validRange": {"min": "10", "max": "60", "step": "25"}}
    assert [dra.consumed(r, 100, policy) for r in (None, 1, 10, 11, 35, 36, 60, 61)] == \
        [10, 10, 10, 35, 35, 60, 60, None]
    assert dra.consumed(None, 100, None) == 100 and dra.consumed(30, 100, None) == 30
    assert dra.consumed(120, 100, None) is None


@given(st.integers(0, 300), st.integers(1, 200))
def test_consumed_never_exceeds_capacity_and_never_shrinks_a_request(requested: int, capacity: int) -> None:
    got = dra.consumed(requested, capacity, dra.share_policy(capacity))
    assert got is None or (max(requested, 1) <= got <= capacity)


@pytest.mark.parametrize("value, count", [("25", 25), (25, 25), ("1k", 1000), (" 7 ", 7), ("2Ki", 2048),
                                          ("25000m", 25)])  # fmt: skip
def test_counts(value: object, count: int) -> None:
    assert dra.parse_count(value, "shares") == count


@pytest.mark.parametrize("value", ["2.5", "-1", "1K", "", True, None, [], "1e19", "500m"])
def test_bad_counts(value: object) -> None:
    with pytest.raises(dra.DraNameError, match="invalid shares") as caught:
        dra.parse_count(value, "shares")
    assert "whole number" in caught.value.reason or "quantity" in caught.value.reason
