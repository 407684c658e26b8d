"""Settings of the device-plugin service: one frozen struct, read once in ``main()``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from gpushare_common.settings import SettingsError, load

PREFIX = "GPUSHARE_DP_"
Policy = Literal["packed", "spread"]
POLICIES: tuple[str, ...] = ("packed", "spread")
SHARE_KINDS: tuple[str, ...] = ("share", "share-dev")


@dataclass(frozen=True, slots=True)
class DevicePluginSettings:
    """``GPUSHARE_DP_*`` variables; lists are comma-separated, maps ``key=value,...``."""

    plugin_dir: str = "/var/lib/kubelet/device-plugins"
    kubelet_socket: str = "kubelet.sock"  # relative to plugin_dir unless absolute
    domain: str = "gpushare"
    share_specs: tuple[int, ...] = (2, 3, 4, 5)
    share_dev_specs: tuple[int, ...] = (2, 4, 8, 16)
    spot: bool = True
    watch_shadow_pods: bool = True  # share plugins learn ShadowPods from the API server
    capacity_resources: tuple[str, ...] = ()  # e.g. vcpu,vmem (see docs/architecture.md, 'Overselling CPU and memory')
    vendor_sockets: dict[str, str] = field(
        default_factory=lambda: {"nvidia.com/gpu": "nvidia-gpu.sock"}
    )
    policy: str = "packed"
    signing_key_file: str = "/etc/gpushare/signing.key"  # the file the runtime and node installer use
    resend_s: float = 60.0  # full ListAndWatch resend, a safety net only
    resync_s: float = 60.0  # re-read of the desired-health bucket, a safety net only
    poll_s: float = 0.2
    backoff_min_s: float = 0.5
    backoff_max_s: float = 30.0
    # share caps (capped ShadowPods): each card's memory per vendor resource, e.g.
    # nvidia.com/gpu=81920, and the share kinds whose SharePods may opt out of their caps
    card_memory_mib: dict[str, str] = field(default_factory=dict)
    isolation_opt_out: tuple[str, ...] = ()
    # topology of the cards (spot-gpu's NUMA nodes, GetPreferredAllocation): the vendor table of
    # the runtime's file says where PCI addresses are; host_root is where the host's /sys and
    # /proc are seen
    runtime_config: str = "/etc/gpushare/runtime.json"
    host_root: str = ""

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


def load_settings(environ: Mapping[str, str] | None = None) -> DevicePluginSettings:
    return load(DevicePluginSettings, PREFIX, environ)
