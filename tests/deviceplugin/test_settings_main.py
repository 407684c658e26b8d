"""Settings from the environment, and the entry point's refusal of a bad configuration."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from gpushare_common.settings import SettingsError, load_service
from gpushare_deviceplugin.settings import Settings


def test_settings_from_environment() -> None:
    settings = load_service(Settings, {
        "GPUSHARE_DP_PLUGIN_DIR": "/run/dp", "GPUSHARE_DP_SHARE_SPECS": "2,4",
        "GPUSHARE_DP_VENDOR_SOCKETS": "nvidia.com/gpu=nvidia.sock, amd.com/gpu=/run/amd.sock",
        "GPUSHARE_DP_POLICY": "spread", "GPUSHARE_DP_SPOT": "false",
    }).deviceplugin
    assert settings.share_specs == (2, 4)
    assert settings.vendor_sockets == {"nvidia.com/gpu": "nvidia.sock",
                                       "amd.com/gpu": "/run/amd.sock"}
    assert settings.path("nvidia.sock") == "/run/dp/nvidia.sock"
    assert settings.path("/run/amd.sock") == "/run/amd.sock"
    assert settings.kubelet_path == "/run/dp/kubelet.sock"
    assert settings.policy == "spread" and settings.spot is False


@pytest.mark.parametrize("environ", [
    {"GPUSHARE_DP_POLICY": "random"},
    {"GPUSHARE_DP_SHARE_SPECS": "2,zero"},
    {"GPUSHARE_DP_SHARE_DEV_SPECS": "0"},
    {"GPUSHARE_DP_CAPACITY_RESOURCES": "vgpu"},
    {"GPUSHARE_DP_VENDOR_SOCKETS": "nvidia.com/gpu"},
    {"GPUSHARE_DP_BACKOFF_MIN_S": "0"},
    {"GPUSHARE_DP_BACKOFF_MIN_S": "5", "GPUSHARE_DP_BACKOFF_MAX_S": "1"},
])
def test_bad_settings_name_the_variable(environ: dict[str, str]) -> None:
    with pytest.raises(SettingsError) as bad:
        load_service(Settings, environ)
    assert bad.value.variable.startswith("GPUSHARE_DP_")


def test_main_refuses_a_missing_key_file(tmp_path: os.PathLike[str]) -> None:
    env = {**os.environ, "GPUSHARE_NODE_NAME": "node-1",
           "GPUSHARE_DP_SIGNING_KEY_FILE": os.path.join(tmp_path, "missing.key")}
    done = subprocess.run([sys.executable, "-m", "gpushare_deviceplugin"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "signing key file" in done.stderr and "missing.key" in done.stderr
