"""The sim scheduler's DRA device selectors: CEL (cel-python) in Kubernetes' selector environment."""

from __future__ import annotations

import pytest
from gpushare_common import dra
from gpushare_sim.dra.cel import CelError, Device, Version, compile_selector, evaluate
from hypothesis import given
from hypothesis import strategies as st

CARD = Device(dra.DRIVER, {f"{dra.DRIVER}/kind": "card", f"{dra.DRIVER}/memoryMiB": 40960,
                           f"{dra.DRIVER}/model": "A100", dra.PCIE_ROOT: "pci0000:00",
                           dra.NUMA_NODE: 0, f"{dra.DRIVER}/healthy": True,
                           f"{dra.DRIVER}/driverVersion": Version("1.4.0-rc.1")}, multiple=True,
              capacity={f"{dra.DRIVER}/{dra.SHARES}": 100})


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
    # what the subset refused, real CEL evaluates
    ('device.capacity["gpushare.k8s.io"].shares.compareTo(quantity("25")) >= 0', True),
    ('device.capacity["gpushare.k8s.io"].shares.isGreaterThan(quantity("1k"))', False),
    ('device.capacity["gpushare.k8s.io"].shares == quantity("100000m")', True),
    ('device.capacity["gpushare.k8s.io"].shares.add(5).compareTo(quantity("105")) == 0', True),
    ('device.capacity["gpushare.k8s.io"].shares.asInteger() == 100 && isQuantity("2Gi")', True),
    ('device.attributes["gpushare.k8s.io"].driverVersion.isGreaterThan(semver("1.3.9"))', True),
    ('device.attributes["gpushare.k8s.io"].driverVersion.compareTo(semver("1.4.0")) < 0', True),
    ('device.attributes["gpushare.k8s.io"].driverVersion.minor() == 4 && isSemver("1.0.0")', True),
    ('device.attributes["gpushare.k8s.io"].model.matches("A.*")', True),
    ('device.attributes["gpushare.k8s.io"].model.startsWith("H")', False),
    ("1 + 2 == 3", True),
    ('device.attributes["gpushare.k8s.io"].memoryMiB >= 4 * 10', True),
    ('has(device.driver)', True),
    ('has(device.attributes["other.example.com"].model)', False),  # a domain without attributes: empty
    ('["A100", "H100"].exists(m, m == device.attributes["gpushare.k8s.io"].model)', True),
    ('size(device.attributes["gpushare.k8s.io"]) == 5', True),
    ("device.driver", False),  # not a bool: matches nothing
    ('device.capacity["gpushare.k8s.io"].shares > quantity("1")', False),  # quantities order by compareTo only
])  # fmt: skip
def test_supported_expressions(expression: str, expected: bool) -> None:
    assert evaluate(compile_selector(expression), CARD) is expected


@pytest.mark.parametrize("expression, reason", [
    ("", "empty expression"),
    ("request.name == 'x'", "undeclared reference to 'request'"),
    ('device.driver == "a', "syntax error at column 18"),
    ("(device.driver == 'a'", "syntax error"),
    ('device.driver == "a" @', "syntax error at column 22"),
    ('device.attributes["gpushare.k8s.io"].model.reverse() == "001A"', "undeclared reference to 'reverse'"),
    ("[1, 2].all(x, y > 0)", "undeclared reference to 'y'"),
    ("[1, 2].all(x)", "all() takes a variable name and an expression"),
    ('has(device.attributes["gpushare.k8s.io"])', "has() takes one field selection"),
    ("google.protobuf.Int64Value{value: 1} == 1", "message type"),
    ('lookup("x")', "undeclared reference to 'lookup'"),
])  # fmt: skip
def test_anything_else_is_refused_naming_what(expression: str, reason: str) -> None:
    with pytest.raises(CelError, match="CEL selector") as caught:
        compile_selector(expression)
    assert reason in caught.value.reason


@given(st.one_of(st.text(max_size=60), st.text('device.attributes["gpushare.k8s.io"]capacity().,[] =!<>&|+1"x',
                                                max_size=80)))
def test_any_text_compiles_or_is_refused(text: str) -> None:
    try:
        program = compile_selector(text)
    except CelError:
        return
    assert evaluate(program, CARD) in (True, False)
