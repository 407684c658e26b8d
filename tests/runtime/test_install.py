"""Install material: the launcher, the containerd drop-in, the RuntimeClass."""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
from gpushare_common import ids
from gpushare_runtime import miniyaml
from gpushare_runtime.config import parse_config

from .builders import identity, spec, write_bundle, write_config
from .conftest import REPO

INSTALL = REPO / "runtime" / "install"
RECORDER = """#!/bin/sh
printf '%s\\n' "$@" > "{out}"
"""


@pytest.fixture
def recorder(tmp_path: Path) -> tuple[Path, Path]:
    """A lower runtime that records the arguments it was given."""
    out = tmp_path / "argv.txt"
    script = tmp_path / "lower.sh"
    script.write_text(RECORDER.format(out=out))
    script.chmod(0o755)
    return script, out


@pytest.mark.parametrize("args", [
    ["--root", "/r", "--log", "/l", "--log-format", "json", "delete", "--force", "c1"],
    ["--systemd-cgroup", "state", "c1"],
    ["--root=/r", "kill", "c1", "KILL"],
    ["--root", "/r", "create", "--bundle", "{bundle}", "--pid-file", "/p", "c1"],
    ["--log", "{log}", "run", "-d", "-b", "{bundle}", "c1"],
])
def test_launcher_passes_arguments_unchanged(runtime_bin: Path, recorder: tuple[Path, Path],
                                             tmp_path: Path, args: list[str]) -> None:
    script, out = recorder
    config = write_config(tmp_path / "runtime.json", lower_runtime=str(script))
    bundle = write_bundle(tmp_path / "bundle", spec(identity("ns", "pod", "c1")))
    args = [a.format(bundle=bundle, log=tmp_path / "log") for a in args]
    subprocess.run([str(runtime_bin), *args], check=True,
                   env={"PATH": "/usr/bin:/bin", "GPUSHARE_RUNTIME_CONFIG": str(config)})
    assert out.read_text().splitlines() == args


def test_launcher_without_config_uses_runc(runtime_bin: Path, tmp_path: Path) -> None:
    env = {"PATH": "/usr/sbin:/usr/bin:/bin", "GPUSHARE_RUNTIME_CONFIG": str(tmp_path / "none")}
    ours = subprocess.run([str(runtime_bin), "--version"], capture_output=True, text=True, env=env)
    theirs = subprocess.run(["runc", "--version"], capture_output=True, text=True)
    assert (ours.returncode, ours.stdout) == (theirs.returncode, theirs.stdout)


def test_broken_config_fails_create_clearly(runtime_bin: Path, tmp_path: Path) -> None:
    config = tmp_path / "runtime.json"
    config.write_text('{"lower_runtime": 3}')
    bundle = write_bundle(tmp_path / "bundle", spec({ids.ANN_DEVICES_FROM + "*": "_/_/main"}))
    result = subprocess.run([str(runtime_bin), "create", "--bundle", str(bundle), "c1"],
                            capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "GPUSHARE_RUNTIME_CONFIG": str(config)})
    assert result.returncode == 1
    assert f"runtime configuration {config}: lower_runtime must be a non-empty string" in result.stderr


def test_containerd_drop_in_registers_the_handler(tmp_path: Path) -> None:
    if shutil.which("containerd") is None:
        pytest.skip("containerd is not installed")
    main = tmp_path / "config.toml"
    main.write_text(f'version = 2\nimports = ["{INSTALL / "containerd-gpushare.toml"}"]\n'
                    f'root = "{tmp_path / "root"}"\nstate = "{tmp_path / "state"}"\n')
    dumped = subprocess.run(["containerd", "-c", str(main), "config", "dump"], check=True,
                            capture_output=True, text=True).stdout
    runtimes = tomllib.loads(dumped)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    handler = runtimes["gpushare"]
    assert handler["runtime_type"] == "io.containerd.runc.v2"
    # containerd 1.x takes the imported file's CRI section whole: without runc, the default
    # handler, the CRI plugin does not load at all
    assert runtimes["runc"]["runtime_type"] == "io.containerd.runc.v2"
    assert handler["pod_annotations"] == handler["container_annotations"] == ["gpushare.k8s.io/*"]
    assert handler["options"]["BinaryName"].endswith("/gpushare-runtime")


def test_runtime_class_is_valid() -> None:
    doc = miniyaml.loads((INSTALL / "runtimeclass.yaml").read_text())
    assert isinstance(doc, dict)
    kubernetes_validate.validate(doc, "1.31.0", strict=True)
    assert doc["metadata"]["name"] == doc["handler"] == "gpushare"


def test_example_config_loads() -> None:
    path = INSTALL / "runtime.json.example"
    config = parse_config(str(path), path.read_text())
    assert config.lower_runtime == "runc"
    assert json.loads(path.read_text())["vendors"].keys() <= config.vendors.keys()


@pytest.mark.parametrize("layout", ["one-line", "spread"])
def test_launcher_reads_lower_runtime_in_any_layout(runtime_bin: Path, recorder: tuple[Path, Path],
                                                    tmp_path: Path, layout: str) -> None:
    script, out = recorder
    fields = {"vendors": {}, "lower_runtime": str(script), "key_file": "/k"}
    text = json.dumps(fields) if layout == "one-line" else json.dumps(fields, indent=4)
    config = tmp_path / "runtime.json"
    config.write_text(text)
    subprocess.run([str(runtime_bin), "state", "c1"], check=True,
                   env={"PATH": "/usr/bin:/bin", "GPUSHARE_RUNTIME_CONFIG": str(config)})
    assert out.read_text().splitlines() == ["state", "c1"]
