"""The CEL subset of the sim scheduler's device selectors."""

from __future__ import annotations

import pytest
from gpushare_common import dra
from gpushare_sim.dra.cel import CelError, Device, compile_selector, evaluate
from hypothesis import given
from hypothesis import strategies as st

CARD = Device(dra.DRIVER, {f"{dra.DRIVER}/kind": "card", f"{dra.DRIVER}/memoryMiB": 40960,
                           f"{dra.DRIVER}/model": "A100", dra.PCIE_ROOT: "pci0000:00",
                           dra.NUMA_NODE: 0, f"{dra.DRIVER}/healthy": True}, multiple=True)


@pytest.mark.parametrize("expression, expected", [
    (dra.CLASS_SELECTORS[dra.SHARE_CLASS], True),
    (dra.CLASS_SELECTORS[dra.SPOT_CLASS], False),
    ('device.attributes["gpushare.k8s.io"].memoryMiB >= 40000', True),
    ('device.attributes["gpushare.k8s.io"]["memoryMiB"] < 40000', False),
    ('device.attributes["resource.kubernetes.io"].pcieRoot == \'pci0000:00\'', True),
    ('device.attributes["gpushare.k8s.io"].model in ["A100", "H100"]', True),
    ('!(device.attributes["gpushare.k8s.io"].model == "H100") && device.allowMultipleAllocations', True),
    ('device.driver == "x.example.com" || device.attributes["gpushare.k8s.io"].healthy', True),
    ('"memoryMiB" in device.attributes["gpushare.k8s.io"]', True),
    ('has(device.attributes["gpushare.k8s.io"].peers)', False),
    ('device.attributes["gpushare.k8s.io"].peers == "x"', False),  # absent: false, not an error
    ('device.attributes["gpushare.k8s.io"].memoryMiB == "40960"', False),  # types differ
    ('device.attributes["gpushare.k8s.io"].model > 1', False),
])
def test_supported_expressions(expression: str, expected: bool) -> None:
    assert evaluate(compile_selector(expression), CARD) is expected


@pytest.mark.parametrize("expression, reason", [
    ("", "empty expression"),
    ('device.capacity["gpushare.k8s.io"].shares.compareTo(quantity("25")) >= 0', "device.capacity is not supported"),
    ('device.attributes["gpushare.k8s.io"].model.matches("A.*")', "unsupported"),
    ("request.name == 'x'", "unsupported 'request'"),
    ('device.driver == "a', "unterminated string"),
    ("1 + 2 == 3", "unsupported"),
    ('device.attributes["gpushare.k8s.io"].memoryMiB >= 4 * 10', "unsupported"),
    ("(device.driver == 'a'", "expected ')'"),
    ('has(device.driver)', "has() takes"),
    ('device.driver == "a" @', "unsupported character"),
])
def test_anything_else_is_refused_naming_what(expression: str, reason: str) -> None:
    with pytest.raises(CelError, match="CEL selector") as caught:
        compile_selector(expression)
    assert reason in caught.value.reason


@given(st.text(max_size=60))
def test_any_text_compiles_or_is_refused(text: str) -> None:
    try:
        program = compile_selector(text)
    except CelError:
        return
    assert evaluate(program, CARD) in (True, False)
