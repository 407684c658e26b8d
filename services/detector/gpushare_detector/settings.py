"""The detector's own settings (environment prefix ``GPUSHARE_DETECTOR_``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpushare_common.settings import CommonSettings, load, load_common

PREFIX = "GPUSHARE_DETECTOR_"
DEFAULT_PORT = 8081


@dataclass(frozen=True, slots=True)
class DetectorSettings:
    # what the pods on this node request
    domain: str = "gpushare"
    vendor_resources: tuple[str, ...] = ("nvidia.com/gpu",)
    # a reserved pod is a lendable dev machine when this label or annotation has this value
    lendable_key: str = "gpushare.k8s.io/lendable"
    lendable_value: str = "true"
    # kubelet pod-resources API
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    pod_resources_timeout_s: float = 2.0
    # full republish of the node's state
    resync_s: float = 60.0
    # how often the cards the kubelet can allocate are read (published when they change)
    inventory_s: float = 10.0
    # GPU metrics exporter (empty url: no scraping, utilisation unknown)
    exporter_url: str = ""
    vendor: str = "nvidia-dcgm"
    mapping_dir: str = ""  # extra or overriding vendor mapping files (*.yaml)
    scrape_s: float = 15.0
    scrape_timeout_s: float = 3.0
    # away/back
    away_window_s: float = 600.0
    kmod_timeout_s: float = 2.0
    # CPU/memory overselling
    cgroup_root: str = "/sys/fs/cgroup"
    proc_root: str = "/proc"
    capacity_s: float = 30.0
    capacity_republish_s: float = 300.0
    capacity_change_ratio: float = 0.10
    capacity_stale_s: float = 900.0
    capacity_usage_step: float = 0.05  # republish when the node's use moves by this share
    safety_margin_ratio: float = 0.10
    reserved_millicores: float = 0.0
    reserved_memory_bytes: float = 0.0


@dataclass(frozen=True, slots=True)
class Settings:
    common: CommonSettings
    detector: DetectorSettings


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    return Settings(
        common=load_common(environ, default_port=DEFAULT_PORT),
        detector=load(DetectorSettings, PREFIX, environ),
    )
