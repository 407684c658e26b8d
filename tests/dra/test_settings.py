"""The driver's settings: bad values name the variable and what it expects, before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from gpushare_common.settings import SettingsError, load
from gpushare_dra_driver.settings import PREFIX, DraSettings


def test_defaults_are_the_kubelets_paths() -> None:
    settings = DraSettings()
    assert settings.registration_socket == "/var/lib/kubelet/plugins_registry/gpushare.k8s.io-reg.sock"
    assert settings.dra_socket == "/var/lib/kubelet/plugins/gpushare.k8s.io/dra.sock"
    assert settings.vendor_socket("nvidia-gpu.sock") == "/var/lib/kubelet/device-plugins/nvidia-gpu.sock"


@pytest.mark.parametrize("variable, value, expected", [
    ("GPUSHARE_DRA_SHARES", "0", "an integer in [1, 1000000]"),
    ("GPUSHARE_DRA_CARD_MEMORY_MIB", "nvidia.com/gpu=lots", "positive whole number of MiB"),
    ("GPUSHARE_DRA_DRIVER", "nodots", "a DNS subdomain"),
    ("GPUSHARE_DRA_POLL_S", "-1", "positive numbers"),
    ("GPUSHARE_DRA_SPOT", "perhaps", "a boolean"),
])
def test_bad_settings_name_the_variable(variable: str, value: str, expected: str) -> None:
    with pytest.raises(SettingsError, match=variable) as caught:
        load(DraSettings, PREFIX, {variable: value})
    assert expected in str(caught.value)


@pytest.mark.parametrize("env, expected", [
    ({"GPUSHARE_DRA_SHARES": "x"}, "GPUSHARE_DRA_SHARES='x': expected a number"),
    ({}, "GPUSHARE_NODE_NAME"),
])
def test_main_refuses_bad_settings_with_one_line(env: dict[str, str], expected: str, tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "gpushare_dra_driver"], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", **env}, timeout=60, check=False)
    assert result.returncode == 2 and expected in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_main_refuses_an_unreadable_vendor_table(tmp_path: Path) -> None:
    config = tmp_path / "runtime.json"
    config.write_text('{"vendors": {"nvidia.com/gpu": {"env": "NVIDIA_VISIBLE_DEVICES"}}}')
    result = subprocess.run([sys.executable, "-m", "gpushare_dra_driver"], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "GPUSHARE_NODE_NAME": "n1",
                                 "GPUSHARE_DRA_RUNTIME_CONFIG": str(config)}, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert "GPUSHARE_DRA_RUNTIME_CONFIG" in result.stderr and ".env must be a list" in result.stderr
