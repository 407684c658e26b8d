"""The detector's settings: ``GPUSHARE_DETECTOR_*`` and the common topics, read once in ``main()``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from gpushare_common.settings import CommonSettings, topic

PREFIX = "GPUSHARE_DETECTOR_"


@dataclass(frozen=True, slots=True)
class DetectorSettings:
    domain: str = "gpushare"
    """The domain of gpushare's resources and annotations (``<domain>/share-gpu-4``, ...)."""
    vendor_resources: tuple[str, ...] = ("nvidia.com/gpu",)
    """The vendors' card resources that pods on this node request."""
    lendable_key: str = "gpushare.k8s.io/lendable"
    """A reserved pod is a lendable dev machine when this label or annotation has lendable_value."""
    lendable_value: str = "true"
    """The value of lendable_key that marks a lendable dev machine."""
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    """The kubelet's pod-resources API: which cards each container holds."""
    pod_resources_timeout_s: float = 2.0
    """How long one pod-resources call may take."""
    resync_s: float = 60.0
    """How often the node's whole state is published again."""
    inventory_s: float = 10.0
    """How often the cards the kubelet can allocate are read (published when they change)."""
    exporter_url: str = ""
    """The GPU metrics exporter's /metrics ("": no scraping, utilisation unknown)."""
    vendor: str = "nvidia-dcgm"
    """Which vendor mapping reads the exporter's metrics."""
    mapping_dir: str = ""
    """A directory of extra or overriding vendor mapping files (*.yaml)."""
    scrape_s: float = 15.0
    """How often the exporter is scraped."""
    scrape_timeout_s: float = 3.0
    """How long one scrape may take."""
    away_window_s: float = 600.0
    """How long a lendable owner's card must stay idle before it is lent."""
    kmod_timeout_s: float = 2.0
    """How long one request to the kmod-bridge may take."""
    cgroup_root: str = "/sys/fs/cgroup"
    """Where the node's cgroup v2 hierarchy is mounted (CPU and memory use)."""
    proc_root: str = "/proc"
    """Where the node's /proc is seen."""
    capacity_s: float = 30.0
    """How often the node's spare CPU and memory are measured."""
    capacity_republish_s: float = 300.0
    """Publish the spare capacity at least this often, changed or not."""
    capacity_change_ratio: float = 0.10
    """Publish the spare capacity when it moves by this share."""
    capacity_stale_s: float = 900.0
    """When the measurements are older than this, nothing is offered as spare."""
    capacity_usage_step: float = 0.05
    """Publish again when the node's use moves by this share."""
    safety_margin_ratio: float = 0.10
    """The share of the node's capacity never offered as spare."""
    reserved_millicores: float = 0.0
    """CPU (millicores) never offered as spare."""
    reserved_memory_bytes: float = 0.0
    """Memory (bytes) never offered as spare."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the detector reads."""

    DEFAULT_PORT: ClassVar[int] = 8081
    common: CommonSettings = field(default_factory=CommonSettings)
    detector: DetectorSettings = topic(DetectorSettings, PREFIX)
