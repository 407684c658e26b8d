from __future__ import annotations

import pytest
from gpushare_common.settings import SettingsError, load_service
from gpushare_detector.app import build_scraper, rules_of
from gpushare_detector.metrics import DetectorMetrics
from gpushare_detector.settings import DetectorSettings, Settings
from gpushare_detector.vendors import MappingError
from prometheus_client import CollectorRegistry


def test_settings_from_the_environment() -> None:
    settings = load_service(Settings, {
        "GPUSHARE_NODE_NAME": "gpu-7.example",
        "GPUSHARE_DETECTOR_VENDOR_RESOURCES": "nvidia.com/gpu, hygon.com/dcu",
        "GPUSHARE_DETECTOR_AWAY_WINDOW_S": "120",
        "GPUSHARE_DETECTOR_LENDABLE_KEY": "acme.io/dev-machine",
    })
    assert settings.common.node.require() == "gpu-7.example"
    assert settings.common.http.port == Settings.DEFAULT_PORT == 8081
    assert settings.detector.vendor_resources == ("nvidia.com/gpu", "hygon.com/dcu")
    assert settings.detector.away_window_s == 120.0
    rules = rules_of(settings.detector)
    assert rules.lendable_key == "acme.io/dev-machine" and rules.vendor_resources[1] == "hygon.com/dcu"


def test_bad_setting_names_the_variable() -> None:
    with pytest.raises(SettingsError, match="GPUSHARE_DETECTOR_RESYNC_S"):
        load_service(Settings, {"GPUSHARE_DETECTOR_RESYNC_S": "soon"})


def test_scraper_needs_a_known_vendor() -> None:
    metrics = DetectorMetrics(CollectorRegistry())
    assert build_scraper(DetectorSettings(), metrics) is None  # no exporter configured
    scraper = build_scraper(DetectorSettings(exporter_url="http://x/metrics", vendor="huawei-ascend"), metrics)
    assert scraper is not None and scraper.mapping.vendor == "huawei-ascend"
    with pytest.raises(MappingError, match="known: enflame"):
        build_scraper(DetectorSettings(exporter_url="http://x/metrics", vendor="acme"), metrics)
