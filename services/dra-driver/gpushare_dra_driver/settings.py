"""The DRA driver's settings: ``GPUSHARE_DRA_*`` and the common topics, read once in ``main()``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from gpushare_common import dra
from gpushare_common.settings import CommonSettings, SettingsError, topic

PREFIX = "GPUSHARE_DRA_"

# NVIDIA's control daemon in the foreground; on SIGTERM it is told to quit (its servers with it)
MPS_COMMAND = ("nvidia-cuda-mps-control -f & daemon=$!; "
               "trap 'echo quit | nvidia-cuda-mps-control; wait \"$daemon\"' TERM INT; wait \"$daemon\"")


@dataclass(frozen=True, slots=True)
class DraSettings:
    """Lists are comma-separated, maps ``key=value,...``."""

    driver: str = dra.DRIVER
    """The driver's name (a DNS subdomain): its ResourceSlices, DeviceClasses and claims name it."""
    registry_dir: str = "/var/lib/kubelet/plugins_registry"
    """The kubelet's plugin watcher directory: the registration socket is made here."""
    plugin_dir: str = "/var/lib/kubelet/plugins/gpushare.k8s.io"
    """The driver's own directory: its DRA socket and the prepared claims' state."""
    cdi_dir: str = "/var/run/cdi"
    """Where prepared claims' CDI specs go (a directory the container runtime reads)."""
    device_plugin_dir: str = "/var/lib/kubelet/device-plugins"
    """Where the vendor plugins' sockets are (read as a client for the node's cards, never
    registered)."""
    vendor_sockets: dict[str, str] = field(default_factory=lambda: {"nvidia.com/gpu": "nvidia-gpu.sock"})
    """Vendor resource -> its vendor plugin's socket (in device_plugin_dir unless absolute)."""
    runtime_config: str = "/etc/gpushare/runtime.json"
    """The vendor table (device nodes, variables, mounts, caps, topology): the runtime's file."""
    host_root: str = ""
    """Where the host's /sys, /proc and /dev are seen (topology, control nodes; "": here)."""
    device_root: str = ""
    """The prefix of device nodes' host paths in CDI specs ("": as the vendor table says)."""
    card_memory_mib: dict[str, str] = field(default_factory=dict)
    """Vendor resource -> each card's memory in MiB (published, and the shares' caps)."""
    card_model: dict[str, str] = field(default_factory=dict)
    """Vendor resource -> the cards' model name (published as an attribute)."""
    isolation_dir: str = "/run/gpushare/isolation"
    """Where the node's MPS directories live (<isolation_dir>/dra)."""
    mps_profiles: tuple[str, ...] = ("mps",)
    """The isolation profiles whose prepared shares need the node's MPS control daemon, which the
    driver runs while any is prepared."""
    mps_command: str = MPS_COMMAND
    """The MPS control daemon's command (run with sh -c, the MPS directories in its environment)."""
    mps_ready_s: float = 10.0
    """The daemon's control socket answers within this, or the capped claims fail."""
    shares: int = dra.DEFAULT_SHARES
    """A card's consumable capacity in shares."""
    extended_share_specs: tuple[int, ...] = ()
    """Unchanged pods (DRAExtendedResource): a slot device per card for each of these share-gpu-N
    kinds, all of a card's devices drawing on its counter (KEP-4815)."""
    extended_dev_specs: tuple[int, ...] = ()
    """The same for the share-dev-gpu-N kinds."""
    spot: bool = True
    """Publish spot mirrors of lendable cards (as the solver's desired health says)."""
    publish_inventory: bool = True
    """Publish the node's CardInventory on NATS (a DRA node's one source of it)."""
    poll_s: float = 0.5
    """How often the sockets are checked (served again when they vanished)."""
    backoff_min_s: float = 0.5
    """The first delay before a failed vendor connection or slice write is tried again."""
    backoff_max_s: float = 10.0
    """The longest delay between two attempts."""
    resync_s: float = 60.0
    """How often the slice and the desired health are read again (a safety net)."""
    instance: str = ""
    """This instance's own socket names (the pod's UID): during a rolling update the old and the
    new driver are registered side by side, the kubelet moving to the newest ("": one name)."""

    def __post_init__(self) -> None:
        if not dra.is_dns_label(self.driver.replace(".", "-")) or "." not in self.driver:
            raise SettingsError("GPUSHARE_DRA_DRIVER", self.driver, "a DNS subdomain like gpushare.k8s.io")
        if not 1 <= self.shares <= 1_000_000:
            raise SettingsError("GPUSHARE_DRA_SHARES", str(self.shares), "an integer in [1, 1000000]")
        for resource, mib in self.card_memory_mib.items():
            if not (mib.isdigit() and mib.isascii() and int(mib) > 0):
                raise SettingsError("GPUSHARE_DRA_CARD_MEMORY_MIB", f"{resource}={mib}",
                                    "resource=MiB pairs with a positive whole number of MiB")
        if self.instance and not dra.is_dns_label(self.instance.lower()):
            raise SettingsError("GPUSHARE_DRA_INSTANCE", self.instance,
                                "letters, digits and '-' (the pod's UID), at most 63")
        for spec in (*self.extended_share_specs, *self.extended_dev_specs):
            if not 2 <= spec <= min(self.shares, 1024):
                raise SettingsError("GPUSHARE_DRA_EXTENDED_SHARE_SPECS", str(spec),
                                    f"share specs N in [2, {min(self.shares, 1024)}] (N slots of a card)")
        if self.mps_ready_s <= 0:
            raise SettingsError("GPUSHARE_DRA_MPS_READY_S", str(self.mps_ready_s), "a positive number of seconds")
        if self.poll_s <= 0 or self.resync_s <= 0:
            raise SettingsError("GPUSHARE_DRA_POLL_S", str(self.poll_s), "positive numbers")

    def card_memory(self) -> dict[str, int]:
        return {resource: int(mib) for resource, mib in self.card_memory_mib.items()}

    def vendor_socket(self, name: str) -> str:
        return name if name.startswith("/") else f"{self.device_plugin_dir.rstrip('/')}/{name}"

    @property
    def registration_socket(self) -> str:
        suffix = f"-{self.instance}" if self.instance else ""
        return f"{self.registry_dir.rstrip('/')}/{self.driver}{suffix}-reg.sock"

    @property
    def dra_socket(self) -> str:
        suffix = f"-{self.instance}" if self.instance else ""
        return f"{self.plugin_dir.rstrip('/')}/dra{suffix}.sock"

    @property
    def slot_kinds(self) -> tuple[tuple[str, int], ...]:
        """(share kind, N) of every slot device a card gets."""
        return (*(("share", n) for n in self.extended_share_specs),
                *(("share-dev", n) for n in self.extended_dev_specs))

    @property
    def mps_dir(self) -> str:
        """The node's MPS directories (pipe, log, shm): the shadow_dir of every capped share."""
        return f"{self.isolation_dir.rstrip('/')}/dra"

    @property
    def state_file(self) -> str:
        return f"{self.plugin_dir.rstrip('/')}/prepared.json"


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the DRA driver reads."""

    DEFAULT_PORT: ClassVar[int] = 8087
    common: CommonSettings = field(default_factory=CommonSettings)
    dra: DraSettings = topic(DraSettings, PREFIX)
