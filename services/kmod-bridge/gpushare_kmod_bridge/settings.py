"""Settings of the kmod-bridge: one frozen struct of ``GPUSHARE_KMOD_*`` variables, read once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpushare_common.settings import SettingsError, load

from .adapters.procfs import KUBELET_PATTERN

PREFIX = "GPUSHARE_KMOD_"
TRANSPORTS = ("netlink", "sim")
SOURCES = ("cgroup", "containerd")


@dataclass(frozen=True, slots=True)
class KmodBridgeSettings:
    transport: str = "netlink"  # netlink: the module; sim: the kernel stand-in's socket
    netlink_unit: int = 31  # the module parameter nl_unit
    sim_socket: str = "/run/gpushare/kmod.sock"
    reply_timeout_s: float = 2.0
    heartbeat_s: float = 2.0
    backoff_min_s: float = 0.05
    backoff_max_s: float = 5.0
    sources: tuple[str, ...] = ("cgroup", "containerd")  # container -> pids, merged by container id
    cgroup_pattern: str = KUBELET_PATTERN
    proc_root: str = "/proc"
    containerd_address: str = "/run/containerd/containerd.sock"
    containerd_namespaces: tuple[str, ...] = ("k8s.io",)
    refresh_s: float = 5.0
    persist: bool = True
    ioctl_types: tuple[int, ...] = ()  # empty: keep the module's filter
    ioctl_majors: tuple[int, ...] = ()
    # keep an owner held while the solver has not answered its owner-back, at most this long (the
    # module's max_hold_ms caps it too); 0: only the kernel's timeout. An owner-back can wait on a
    # NATS failover or a solver restart, and the owner must not run beside live borrowers.
    hold_unanswered_s: float = 30.0

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
        if self.hold_unanswered_s < 0:
            raise SettingsError("GPUSHARE_KMOD_HOLD_UNANSWERED_S", str(self.hold_unanswered_s),
                                "0 (off) or a positive number of seconds")
        if self.backoff_min_s > self.backoff_max_s:
            raise SettingsError("GPUSHARE_KMOD_BACKOFF_MIN_S", str(self.backoff_min_s),
                                f"at most GPUSHARE_KMOD_BACKOFF_MAX_S ({self.backoff_max_s})")


def load_settings(environ: Mapping[str, str] | None = None) -> KmodBridgeSettings:
    return load(KmodBridgeSettings, PREFIX, environ)
