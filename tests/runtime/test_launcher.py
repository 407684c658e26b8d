"""The launcher's fast path: a create whose config.json names no gpushare annotation
goes straight to the lower runtime, and only such a create (never a false negative)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from gpushare_common import ids
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .builders import spec, write_bundle

ANNOTATION = ids.ANN_DEVICES_FROM + "*"
LOWER = """#!/bin/sh
printf '%s\\n' "$@" > "{out}"
"""


class Setup:
    """A recording lower runtime and a configuration the Python runtime refuses: exit 0 with
    the arguments recorded means the launcher went straight to the lower runtime; exit 1
    with the configuration error means the Python runtime ran."""

    def __init__(self, tmp_path: Path, runtime_bin: Path) -> None:
        self.runtime_bin = runtime_bin
        self.out = tmp_path / "argv.txt"
        lower = tmp_path / "lower.sh"
        lower.write_text(LOWER.format(out=self.out))
        lower.chmod(0o755)
        self.config = tmp_path / "runtime.json"
        self.config.write_text(json.dumps({"lower_runtime": str(lower), "cdi_dirs": 5}))

    def python_ran(self, args: list[str], cwd: Path) -> bool:
        self.out.unlink(missing_ok=True)
        result = subprocess.run([str(self.runtime_bin), *args], capture_output=True, text=True,
                                cwd=cwd, check=False, timeout=30,
                                env={"PATH": "/usr/bin:/bin", "GPUSHARE_RUNTIME_CONFIG": str(self.config)})
        if result.returncode == 0:
            assert self.out.read_text().splitlines() == args
            return False
        assert result.returncode == 1 and "cdi_dirs must be" in result.stderr, result.stderr
        return True


@pytest.fixture
def setup(tmp_path: Path, runtime_bin: Path) -> Setup:
    return Setup(tmp_path, runtime_bin)


FORMS = [
    ["create", "--bundle", "{B}", "c1"],
    ["create", "-b", "{B}", "c1"],
    ["create", "--bundle={B}", "c1"],
    ["create", "-b={B}", "c1"],
    ["create", "---bundle", "{B}", "c1"],
    ["create", "-b", "{D}", "--bundle", "{B}", "c1"],
    ["create", "--bundle", "{B}", "-b", "{D}", "c1"],
    ["create", "--bundle", "", "-b", "{B}", "c1"],
    ["create", "--bundle", "{D}", "--bundle", "{B}", "c1"],
    ["--root", "/r", "--log=/l", "--log-format", "json", "run", "--pid-file", "/p", "-b", "{B}", "c1"],
    ["--", "create", "--console-socket", "/s", "--bundle", "{B}", "c1"],
    ["create", "c1"],
    ["create", "--", "--bundle", "{D}"],
    ["create", "c1", "--bundle", "{D}"],
]


@pytest.mark.parametrize("form", FORMS)
def test_launcher_reads_the_bundle_the_runtime_reads(setup: Setup, tmp_path: Path,
                                                     form: list[str]) -> None:
    """{B} (and the working directory) is the bundle the create is for, {D} a decoy: each
    direction shows that the launcher looked at the same config.json as the runtime."""
    annotated = spec({ANNOTATION: "_/_/main"})
    for chosen, decoy, python in ((annotated, spec(), True), (spec(), annotated, False)):
        bundle = write_bundle(tmp_path / "b", chosen)
        other = write_bundle(tmp_path / "d", decoy)
        args = [a.replace("{B}", str(bundle)).replace("{D}", str(other)) for a in form]
        assert setup.python_ran(args, cwd=bundle) is python, (args, python)


def test_dot_dot_bundles_always_go_through_python(setup: Setup, tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b", spec())
    assert setup.python_ran(["create", "--bundle", f"{bundle}/../b", "c1"], cwd=tmp_path)


def test_unreadable_bundle_goes_through_python(setup: Setup, tmp_path: Path) -> None:
    assert setup.python_ran(["create", "--bundle", str(tmp_path / "missing"), "c1"], cwd=tmp_path)


def _escaped(key: str, choices: list[int]) -> str:
    """``key`` as a JSON string with each character literal (0), \\uXXXX (1, 2) or \\/ (3)."""
    parts = []
    for char, choice in zip(key, choices, strict=True):
        if choice in (1, 2):
            code = f"\\u{ord(char):04x}"
            parts.append(code.upper().replace("\\U", "\\u") if choice == 2 else code)
        elif choice == 3 and char == "/":
            parts.append("\\/")
        else:
            parts.append(char)
    return '"' + "".join(parts) + '"'


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 3), min_size=len(ANNOTATION), max_size=len(ANNOTATION)))
def test_an_escaped_annotation_is_never_missed(setup: Setup, tmp_path: Path,
                                               choices: list[int]) -> None:
    """However JSON spells the annotation's key, the create goes through the runtime."""
    text = json.dumps(spec({"placeholder": "_/_/main"}))
    text = text.replace('"placeholder"', _escaped(ANNOTATION, choices))
    assert json.loads(text)["annotations"] == {ANNOTATION: "_/_/main"}
    bundle = tmp_path / "escaped"
    bundle.mkdir(exist_ok=True)
    (bundle / "config.json").write_text(text)
    assert setup.python_ran(["create", "--bundle", str(bundle), "c1"], cwd=tmp_path)
