"""posixfs gives what os / os.path give, and the create path never imports os."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpushare_runtime import posixfs
from hypothesis import given
from hypothesis import strategies as st

from .builders import gpu_device, identity, read_spec, spec, write_bundle
from .conftest import REPO

paths = st.lists(st.sampled_from(["", ".", "..", "a", "b.c", "/", "//", "///", "x/", "/y"]),
                 max_size=8).map("/".join)


@given(paths)
def test_path_helpers_match_os_path(path: str) -> None:
    assert posixfs.normpath(path) == os.path.normpath(path)
    assert posixfs.dirname(path) == os.path.dirname(path)
    assert posixfs.basename(path) == os.path.basename(path)
    assert posixfs.abspath(path) == os.path.abspath(path)


@given(st.lists(paths, min_size=1, max_size=4))
def test_join_matches_os_path(parts: list[str]) -> None:
    assert posixfs.join(*parts) == os.path.join(*parts)


def test_makedirs_and_exists(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c"
    posixfs.makedirs(str(target), 0o700)
    posixfs.makedirs(str(target), 0o700)
    assert posixfs.exists(str(target)) and not posixfs.exists(str(tmp_path / "missing"))
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError):
        posixfs.makedirs(str(tmp_path / "file"))


def test_execvp_reports_a_missing_program() -> None:
    with pytest.raises(FileNotFoundError):
        posixfs.execvp("gpushare-no-such-program", ["x"])
    with pytest.raises(FileNotFoundError):
        posixfs.execvp("/nonexistent/program", ["x"])


CREATE = """
import sys
sys.path[:0] = [{runtime!r}, {common!r}]
import posix
posix.execv = lambda path, args: (print(" ".join(sys.modules)), sys.exit(0))
from gpushare_runtime.main import main
sys.exit(main(["create", "--bundle", {bundle!r}, "c1"]))
"""


def test_create_path_does_not_import_os(tmp_path: Path) -> None:
    write_bundle(tmp_path / "source", spec(identity("ns", "pod", "main"), [gpu_device()]))
    bundle = write_bundle(tmp_path / "target", spec({
        **identity("ns", "pod", "dind"), "gpushare.k8s.io/container-devices-from.*": "_/_/main"}))
    config = tmp_path / "runtime.json"
    config.write_text('{"lower_runtime": "/bin/true", "index_dir": ""}')
    code = CREATE.format(runtime=str(REPO / "runtime"), common=str(REPO / "libs" / "common"),
                         bundle=str(bundle))
    result = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True,
                            env={"GPUSHARE_RUNTIME_CONFIG": str(config)}, check=False, timeout=30)
    assert result.returncode == 0, result.stderr
    assert read_spec(bundle)["linux"]["devices"]
    modules = set(result.stdout.split())
    assert {"gpushare_runtime.inject", "gpushare_common.ids"} <= modules
    assert not modules & {"os", "typing", "re", "json", "hashlib", "hmac", "dataclasses"}
