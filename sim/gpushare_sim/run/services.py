"""Which gpushare services run on each simulated node, and their settings.

The windows are short on purpose so the scenarios play in seconds: the
owner's away window, the exporter scrape period and the ShadowPod idle
timeout are a few seconds here (minutes in production). The ShadowPods of
``capped_resources`` carry the fake cards' isolation profile, so their shares
get caps (the ``caps`` scenario); every other share stays a soft share.

Each service's variables are written from its own settings struct
(:func:`~gpushare_common.settings.env_of`), so a renamed field fails the type
check here instead of leaving the service on its default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpushare_common.settings import env_of
from gpushare_console import settings as console_settings
from gpushare_detector import settings as detector
from gpushare_deviceplugin import settings as deviceplugin
from gpushare_dra_driver import settings as dra_driver
from gpushare_kmod_bridge import settings as kmod_bridge
from gpushare_shadow_controller import settings as shadow
from gpushare_solver import settings as solver

from gpushare_sim.fakegpu import vendor
from gpushare_sim.fakegpu.cards import VENDOR_RESOURCE

if TYPE_CHECKING:
    from gpushare_sim.run.cluster import Cluster, Node


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    away_window_s: float = 3.0
    scrape_s: float = 0.5
    idle_timeout_s: float = 4.0
    share_specs: tuple[int, ...] = (2, 3, 4, 5)
    share_dev_specs: tuple[int, ...] = (2, 4, 8, 16)
    kmod_refresh_s: float = 1.0
    shadow_resync_s: float = 2.0
    capped_resources: tuple[str, ...] = ("share-gpu-3", "share-dev-gpu-4")  # no other scenario uses them


def node_services(cluster: Cluster, node: Node) -> list[tuple[str, str, dict[str, str]]]:
    """``(service, module, GPUSHARE_* variables)`` for every per-node service, in start order."""
    s = cluster.settings.services
    ep = node.endpoints
    containerd = ep.get("containerd_address", "")
    namespace = ep.get("containerd_namespace", "") or "k8s.io"
    kill = env_of(solver.SolverSettings, solver.PREFIX, containerd_address=containerd, containerd_namespace=namespace,
                  pod_resources_socket=ep["pod_resources_socket"]) if containerd else \
        env_of(solver.SolverSettings, solver.PREFIX, direct_kill=False, pod_resources_socket=ep["pod_resources_socket"])
    if node.dra:
        return dra_node_services(cluster, node)
    return [
        ("kmod-bridge", "gpushare_kmod_bridge", env_of(
            kmod_bridge.KmodBridgeSettings, kmod_bridge.PREFIX, transport="sim", sim_socket=str(node.cmd_socket),
            sources=("containerd",) if containerd else ("cgroup",), containerd_address=containerd,
            containerd_namespaces=(namespace,), refresh_s=s.kmod_refresh_s)),
        ("solver", "gpushare_solver", kill),
        ("deviceplugin", "gpushare_deviceplugin", env_of(
            deviceplugin.DevicePluginSettings, deviceplugin.PREFIX, plugin_dir=str(node.dir / "device-plugins"),
            signing_key_file=ep["signing_key"], share_specs=s.share_specs, share_dev_specs=s.share_dev_specs,
            card_memory_mib={VENDOR_RESOURCE: str(ep["gpu_memory_mib"])})),
        ("detector", "gpushare_detector", env_of(
            detector.DetectorSettings, detector.PREFIX, pod_resources_socket=ep["pod_resources_socket"],
            exporter_url=ep["exporter"], scrape_s=s.scrape_s, away_window_s=s.away_window_s)),
    ]  # fmt: skip


def dra_node_services(cluster: Cluster, node: Node) -> list[tuple[str, str, dict[str, str]]]:
    """A DRA node: the DRA driver in place of the device plugins (it publishes the node's cards,
    from the vendor plugin it reads, as its card inventory, and runs the stand-in MPS control
    daemon while capped shares are prepared), the solver tainting owner-back spot devices."""
    services = {name: (module, env) for name, module, env in node_services(cluster, _plain(node))}
    d = node.dir
    services.pop("deviceplugin")
    services["solver"][1].update(env_of(solver.SolverSettings, solver.PREFIX, dra_taints=True))
    services["dra-driver"] = ("gpushare_dra_driver", env_of(
        dra_driver.DraSettings, dra_driver.PREFIX, registry_dir=str(d / "plugins_registry"),
        plugin_dir=str(d / "plugins" / "gpushare.k8s.io"), cdi_dir=str(d / "cdi"),
        device_plugin_dir=str(d / "device-plugins"), runtime_config=str(d / "runtime.json"), host_root=str(d),
        device_root=str(d), isolation_dir=str(d / "isolation"), mps_profiles=(vendor.PROFILE,),
        extended_share_specs=cluster.settings.services.share_specs,
        extended_dev_specs=cluster.settings.services.share_dev_specs,
        mps_command=vendor.MPS_STAND_IN,
        card_memory_mib={VENDOR_RESOURCE: str(node.endpoints["gpu_memory_mib"])}))  # fmt: skip
    return [(name, module, env) for name, (module, env) in services.items()]


def _plain(node: Node) -> Node:
    from dataclasses import replace

    return replace(node, dra=False)


def shadow_controller(cluster: Cluster) -> dict[str, str]:
    s = cluster.settings.services
    return env_of(shadow.ShadowSettings, shadow.PREFIX, idle_timeout_s=s.idle_timeout_s,
                  resync_s=s.shadow_resync_s, lease_duration_s=3, renew_every_s=1, identity="sim-run",
                  isolation_profiles={r: vendor.PROFILE for r in s.capped_resources})


def console(cluster: Cluster) -> dict[str, str]:
    """The console's settings: the stream read every 0.1 s, lost watches seen within 3 s, DRA
    claims and slices followed (the API emulator serves ``resource.k8s.io/v1``)."""
    return env_of(console_settings.ConsoleSettings, console_settings.PREFIX, poll_s=0.1, heartbeat_s=1.0,
                  dra=True)
