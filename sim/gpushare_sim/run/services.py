"""Which gpushare services run on each simulated node, and their settings.

The windows are short on purpose so the scenarios play in seconds: the
owner's away window, the exporter scrape period and the ShadowPod idle
timeout are a few seconds here (minutes in production).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpushare_sim.run.cluster import Cluster, Node


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    away_window_s: float = 3.0
    scrape_s: float = 0.5
    idle_timeout_s: float = 4.0
    share_specs: str = "2,3,4,5"
    share_dev_specs: str = "2,4,8,16"
    kmod_refresh_s: float = 1.0
    shadow_resync_s: float = 2.0


def node_services(cluster: Cluster, node: Node) -> list[tuple[str, str, dict[str, str]]]:
    """``(service, module, GPUSHARE_* variables)`` for every per-node service, in start order."""
    s = cluster.settings.services
    ep = node.endpoints
    containerd = ep.get("containerd_address", "")
    namespace = ep.get("containerd_namespace", "") or "k8s.io"
    kill = {"GPUSHARE_SOLVER_CONTAINERD_ADDRESS": containerd, "GPUSHARE_SOLVER_CONTAINERD_NAMESPACE": namespace}
    sources = "containerd" if containerd else "cgroup"
    if node.dra:
        return dra_node_services(cluster, node, kill if containerd else {"GPUSHARE_SOLVER_DIRECT_KILL": "false"},
                                 sources)
    return [
        ("kmod-bridge", "gpushare_kmod_bridge", {
            "GPUSHARE_KMOD_TRANSPORT": "sim", "GPUSHARE_KMOD_SIM_SOCKET": str(node.cmd_socket),
            "GPUSHARE_KMOD_SOURCES": sources, "GPUSHARE_KMOD_CONTAINERD_ADDRESS": containerd,
            "GPUSHARE_KMOD_CONTAINERD_NAMESPACES": namespace,
            "GPUSHARE_KMOD_REFRESH_S": str(s.kmod_refresh_s)}),
        ("solver", "gpushare_solver", kill if containerd else {"GPUSHARE_SOLVER_DIRECT_KILL": "false"}),
        ("deviceplugin", "gpushare_deviceplugin", {
            "GPUSHARE_DP_PLUGIN_DIR": str(node.dir / "device-plugins"),
            "GPUSHARE_DP_SIGNING_KEY_FILE": ep["signing_key"],
            "GPUSHARE_DP_SHARE_SPECS": s.share_specs, "GPUSHARE_DP_SHARE_DEV_SPECS": s.share_dev_specs}),
        ("detector", "gpushare_detector", {
            "GPUSHARE_DETECTOR_POD_RESOURCES_SOCKET": ep["pod_resources_socket"],
            "GPUSHARE_DETECTOR_EXPORTER_URL": ep["exporter"],
            "GPUSHARE_DETECTOR_SCRAPE_S": str(s.scrape_s),
            "GPUSHARE_DETECTOR_AWAY_WINDOW_S": str(s.away_window_s)}),
    ]  # fmt: skip


def dra_node_services(cluster: Cluster, node: Node, kill: dict[str, str],
                      sources: str) -> list[tuple[str, str, dict[str, str]]]:
    """A DRA node: the DRA driver in place of the device plugins (it publishes the node's cards,
    from the vendor plugin it reads, as its card inventory), the solver tainting owner-back spot
    devices."""
    services = {name: (module, env) for name, module, env in node_services(cluster, _plain(node))}
    d = node.dir
    services.pop("deviceplugin")
    services["solver"][1]["GPUSHARE_SOLVER_DRA_TAINTS"] = "true"
    services["dra-driver"] = ("gpushare_dra_driver", {
        "GPUSHARE_DRA_REGISTRY_DIR": str(d / "plugins_registry"),
        "GPUSHARE_DRA_PLUGIN_DIR": str(d / "plugins" / "gpushare.k8s.io"),
        "GPUSHARE_DRA_CDI_DIR": str(d / "cdi"), "GPUSHARE_DRA_DEVICE_PLUGIN_DIR": str(d / "device-plugins"),
        "GPUSHARE_DRA_RUNTIME_CONFIG": str(d / "runtime.json"), "GPUSHARE_DRA_HOST_ROOT": str(d),
        "GPUSHARE_DRA_DEVICE_ROOT": str(d), "GPUSHARE_DRA_ISOLATION_DIR": str(d / "isolation"),
        "GPUSHARE_DRA_CARD_MEMORY_MIB": "nvidia.com/gpu=16384"})
    return [(name, module, env) for name, (module, env) in services.items()]


def _plain(node: Node) -> Node:
    from dataclasses import replace

    return replace(node, dra=False)


def shadow_controller(cluster: Cluster) -> dict[str, str]:
    s = cluster.settings.services
    return {
        "GPUSHARE_SHADOW_IDLE_TIMEOUT_S": str(s.idle_timeout_s),
        "GPUSHARE_SHADOW_RESYNC_S": str(s.shadow_resync_s),
        "GPUSHARE_SHADOW_LEASE_DURATION_S": "3", "GPUSHARE_SHADOW_RENEW_EVERY_S": "1",
        "GPUSHARE_SHADOW_IDENTITY": "sim-run",
    }  # fmt: skip


def console(cluster: Cluster) -> dict[str, str]:
    """The console's settings: the stream read every 0.1 s, lost watches seen within 3 s."""
    return {"GPUSHARE_CONSOLE_POLL_S": "0.1", "GPUSHARE_CONSOLE_HEARTBEAT_S": "1"}
