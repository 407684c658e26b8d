"""The kmod-bridge's settings: ``GPUSHARE_KMOD_*`` and the common topics, read once in ``main()``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from gpushare_common.settings import CommonSettings, SettingsError, topic

from .adapters.procfs import KUBELET_PATTERN

PREFIX = "GPUSHARE_KMOD_"
TRANSPORTS = ("netlink", "sim")
SOURCES = ("cgroup", "containerd")


@dataclass(frozen=True, slots=True)
class KmodBridgeSettings:
    transport: str = "netlink"
    """How the kernel is reached: netlink (the module) or sim (the kernel stand-in's socket)."""
    netlink_unit: int = 31
    """The netlink unit: the module parameter nl_unit."""
    sim_socket: str = "/run/gpushare/kmod.sock"
    """The kernel stand-in's socket (transport sim)."""
    reply_timeout_s: float = 2.0
    """How long the kernel may take to answer one command."""
    heartbeat_s: float = 2.0
    """How often the link to the kernel is checked."""
    backoff_min_s: float = 0.05
    """The first delay before the kernel link is tried again."""
    backoff_max_s: float = 5.0
    """The longest delay between two attempts at the kernel link."""
    sources: tuple[str, ...] = ("cgroup", "containerd")
    """Where containers' processes are found (container -> pids, merged by container id): cgroup
    and/or containerd."""
    cgroup_pattern: str = KUBELET_PATTERN
    """How the container id is read from a process's cgroup path (a regular expression)."""
    proc_root: str = "/proc"
    """Where the node's /proc is seen."""
    containerd_address: str = "/run/containerd/containerd.sock"
    """containerd's socket (source containerd)."""
    containerd_namespaces: tuple[str, ...] = ("k8s.io",)
    """The containerd namespaces whose containers are watched."""
    refresh_s: float = 5.0
    """How often the containers' processes are listed again."""
    persist: bool = True
    """Keep the watch set in its bucket (restored after a restart)."""
    ioctl_types: tuple[int, ...] = ()
    """The ioctl types the module counts as GPU calls (empty: keep the module's filter)."""
    ioctl_majors: tuple[int, ...] = ()
    """The device majors the module watches (empty: keep the module's filter)."""

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise SettingsError("GPUSHARE_KMOD_TRANSPORT", self.transport, " or ".join(TRANSPORTS))
        for source in self.sources:
            if source not in SOURCES:
                raise SettingsError("GPUSHARE_KMOD_SOURCES", source, f"some of {', '.join(SOURCES)}")
        for name in ("reply_timeout_s", "heartbeat_s", "backoff_min_s", "backoff_max_s", "refresh_s"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"GPUSHARE_KMOD_{name.upper()}", str(getattr(self, name)),
                                    "a positive number")
        if self.backoff_min_s > self.backoff_max_s:
            raise SettingsError("GPUSHARE_KMOD_BACKOFF_MIN_S", str(self.backoff_min_s),
                                f"at most GPUSHARE_KMOD_BACKOFF_MAX_S ({self.backoff_max_s})")


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the kmod-bridge reads."""

    DEFAULT_PORT: ClassVar[int] = 8085
    common: CommonSettings = field(default_factory=CommonSettings)
    kmod: KmodBridgeSettings = topic(KmodBridgeSettings, PREFIX)
