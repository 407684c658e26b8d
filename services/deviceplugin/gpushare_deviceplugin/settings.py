"""The device plugin's settings: ``GPUSHARE_DP_*`` and the common topics, read once in ``main()``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from gpushare_common.settings import CommonSettings, SettingsError, topic

PREFIX = "GPUSHARE_DP_"
Policy = Literal["packed", "spread"]
POLICIES: tuple[str, ...] = ("packed", "spread")
SHARE_KINDS: tuple[str, ...] = ("share", "share-dev")


@dataclass(frozen=True, slots=True)
class DevicePluginSettings:
    """``GPUSHARE_DP_*`` variables; lists are comma-separated, maps ``key=value,...``."""

    plugin_dir: str = "/var/lib/kubelet/device-plugins"
    """The kubelet's device-plugin directory: the plugins' sockets are made here."""
    kubelet_socket: str = "kubelet.sock"
    """The kubelet's registration socket, relative to plugin_dir unless absolute."""
    domain: str = "gpushare"
    """The domain of the resources served (``<domain>/share-gpu-4``, ...)."""
    share_specs: tuple[int, ...] = (2, 3, 4, 5)
    """The N of each share-gpu-N resource served (a card shared N ways)."""
    share_dev_specs: tuple[int, ...] = (2, 4, 8, 16)
    """The N of each share-dev-gpu-N resource served (a dev machine's card shared N ways)."""
    spot: bool = True
    """Serve spot-gpu: idle dev machines' cards lent to spot pods."""
    watch_shadow_pods: bool = True
    """Share plugins learn the node's ShadowPods from the API server."""
    capacity_resources: tuple[str, ...] = ()
    """Oversold CPU and memory resources served: vcpu and/or vmem (see docs/architecture.md,
    'Overselling CPU and memory')."""
    vendor_sockets: dict[str, str] = field(
        default_factory=lambda: {"nvidia.com/gpu": "nvidia-gpu.sock"}
    )
    """Vendor resource -> the vendor device plugin's socket (in plugin_dir unless absolute), read
    for the node's cards."""
    policy: str = "packed"
    """Which cards a SharePod gets: packed (fill a card first) or spread."""
    signing_key_file: str = "/etc/gpushare/signing.key"
    """The node key the runtime and the node installer use: Allocate answers are signed with it."""
    resend_s: float = 60.0
    """How often ListAndWatch sends the full list again (a safety net only)."""
    resync_s: float = 60.0
    """How often the desired-health bucket is read again (a safety net only)."""
    poll_s: float = 0.2
    """How often the kubelet's socket and the plugins' own sockets are checked."""
    backoff_min_s: float = 0.5
    """The first delay before a failed registration or vendor connection is tried again."""
    backoff_max_s: float = 30.0
    """The longest delay between two attempts."""
    card_memory_mib: dict[str, str] = field(default_factory=dict)
    """Each card's memory (MiB) per vendor resource, e.g. nvidia.com/gpu=81920: the shares' caps."""
    isolation_opt_out: tuple[str, ...] = ()
    """The share kinds (share, share-dev) whose SharePods may opt out of their caps."""
    runtime_config: str = "/etc/gpushare/runtime.json"
    """The runtime's file: its vendor table says where each card's PCI address is (topology)."""
    host_root: str = ""
    """Where the host's /sys and /proc are seen ("": here)."""

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise SettingsError("GPUSHARE_DP_POLICY", self.policy, " or ".join(POLICIES))
        for spec in (*self.share_specs, *self.share_dev_specs):
            if spec < 1:
                raise SettingsError("GPUSHARE_DP_SHARE_SPECS", str(spec), "positive integers")
        for name in self.capacity_resources:
            if name not in ("vcpu", "vmem"):
                raise SettingsError("GPUSHARE_DP_CAPACITY_RESOURCES", name, "vcpu and/or vmem")
        if self.resend_s <= 0 or self.poll_s <= 0:
            raise SettingsError("GPUSHARE_DP_RESEND_S", str(self.resend_s), "a positive number")
        if not 0 < self.backoff_min_s <= self.backoff_max_s:
            raise SettingsError("GPUSHARE_DP_BACKOFF_MIN_S", str(self.backoff_min_s),
                                f"a positive number at most GPUSHARE_DP_BACKOFF_MAX_S ({self.backoff_max_s})")
        for kind in self.isolation_opt_out:
            if kind not in SHARE_KINDS:
                raise SettingsError("GPUSHARE_DP_ISOLATION_OPT_OUT", kind, " or ".join(SHARE_KINDS))
        for resource, mib in self.card_memory_mib.items():
            if not (mib.isdigit() and mib.isascii() and int(mib) > 0):
                raise SettingsError("GPUSHARE_DP_CARD_MEMORY_MIB", f"{resource}={mib}",
                                    "resource=MiB pairs with a positive whole number of MiB")

    def card_memory(self) -> dict[str, int]:
        return {resource: int(mib) for resource, mib in self.card_memory_mib.items()}

    def path(self, name: str) -> str:
        """A socket path: absolute names pass through, others live in ``plugin_dir``."""
        return name if name.startswith("/") else f"{self.plugin_dir.rstrip('/')}/{name}"

    @property
    def kubelet_path(self) -> str:
        return self.path(self.kubelet_socket)


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the device plugin reads."""

    DEFAULT_PORT: ClassVar[int] = 8083
    common: CommonSettings = field(default_factory=CommonSettings)
    deviceplugin: DevicePluginSettings = topic(DevicePluginSettings, PREFIX)
