"""Settings of the DRA driver: one frozen struct, read once in ``main()`` (``GPUSHARE_DRA_*``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpushare_common import dra
from gpushare_common.settings import SettingsError, load


@dataclass(frozen=True, slots=True)
class DraSettings:
    """Lists are comma-separated, maps ``key=value,...``."""

    driver: str = dra.DRIVER
    # the kubelet's plugin watcher directory (our registration socket) and our own directory
    registry_dir: str = "/var/lib/kubelet/plugins_registry"
    plugin_dir: str = "/var/lib/kubelet/plugins/gpushare.k8s.io"
    # where prepared claims' CDI specs go (a directory the container runtime reads)
    cdi_dir: str = "/var/run/cdi"
    # the node's cards: the vendor plugins' sockets (read as a client, never registered by us)
    device_plugin_dir: str = "/var/lib/kubelet/device-plugins"
    vendor_sockets: dict[str, str] = field(default_factory=lambda: {"nvidia.com/gpu": "nvidia-gpu.sock"})
    # the vendor table (device nodes, variables, mounts, caps, topology): the runtime's file
    runtime_config: str = "/etc/gpushare/runtime.json"
    host_root: str = ""  # where the host's /sys, /proc and /dev are seen (topology, control nodes)
    device_root: str = ""  # prefix of device nodes' host paths in CDI specs ("": as the table says)
    card_memory_mib: dict[str, str] = field(default_factory=dict)  # vendor resource -> MiB
    card_model: dict[str, str] = field(default_factory=dict)  # vendor resource -> model name
    isolation_dir: str = "/run/gpushare/isolation"  # a capped card's MPS directories live here
    shares: int = dra.DEFAULT_SHARES  # a card's consumable capacity
    spot: bool = True  # publish spot mirrors of lendable cards (solver's desired health)
    publish_inventory: bool = True  # the node's CardInventory on NATS (a DRA node's one source)
    poll_s: float = 0.5  # registration socket checks
    backoff_min_s: float = 0.5
    backoff_max_s: float = 10.0
    resync_s: float = 60.0  # slices re-read and desired health re-read, a safety net

    def __post_init__(self) -> None:
        if not dra.is_dns_label(self.driver.replace(".", "-")) or "." not in self.driver:
            raise SettingsError("GPUSHARE_DRA_DRIVER", self.driver, "a DNS subdomain like gpushare.k8s.io")
        if not 1 <= self.shares <= 1_000_000:
            raise SettingsError("GPUSHARE_DRA_SHARES", str(self.shares), "an integer in [1, 1000000]")
        for resource, mib in self.card_memory_mib.items():
            if not (mib.isdigit() and mib.isascii() and int(mib) > 0):
                raise SettingsError("GPUSHARE_DRA_CARD_MEMORY_MIB", f"{resource}={mib}",
                                    "resource=MiB pairs with a positive whole number of MiB")
        if self.poll_s <= 0 or self.resync_s <= 0:
            raise SettingsError("GPUSHARE_DRA_POLL_S", str(self.poll_s), "positive numbers")

    def card_memory(self) -> dict[str, int]:
        return {resource: int(mib) for resource, mib in self.card_memory_mib.items()}

    def vendor_socket(self, name: str) -> str:
        return name if name.startswith("/") else f"{self.device_plugin_dir.rstrip('/')}/{name}"

    @property
    def registration_socket(self) -> str:
        return f"{self.registry_dir.rstrip('/')}/{self.driver}-reg.sock"

    @property
    def dra_socket(self) -> str:
        return f"{self.plugin_dir.rstrip('/')}/dra.sock"

    @property
    def state_file(self) -> str:
        return f"{self.plugin_dir.rstrip('/')}/prepared.json"


PREFIX = "GPUSHARE_DRA_"


def load_settings(environ: Mapping[str, str] | None = None) -> DraSettings:
    return load(DraSettings, PREFIX, environ)
