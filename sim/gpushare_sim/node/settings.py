"""Settings of one simulated node (one frozen struct, built once in main)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

SIM_NODE_LABEL = "gpushare.k8s.io/sim-node"
DRA_NODE_LABEL = "gpushare.k8s.io/dra"


@dataclass(frozen=True, slots=True)
class NodeSimSettings:
    name: str
    sim_dir: Path
    kubeconfig: str = ""
    gpus: int = 4
    http_host: str = "127.0.0.1"
    http_port: int = 0
    exporter_port: int = 0
    ports_dir: str = ""  # report the bound ports in a ports file here (gpushare_common.ports)
    # "auto": a private containerd when root and the binaries are there, else
    # processes; "none": processes; anything else: a containerd socket path.
    containerd: str = "auto"
    containerd_namespace: str = "k8s.io"
    # how the kubelet drives containerd: "cri", its CRI plugin as a kubelet does (a pod sandbox
    # per pod, the runtime handler's annotation filters); "ctr", `ctr run` with an OCI spec of
    # the node's own (every annotation through)
    containerd_api: str = "cri"
    runtime_handler: str = "gpushare"  # the CRI runtime handler (the RuntimeClass's handler)
    # runc-compatible binary for containers: "auto" (gpushare-runtime beside the
    # interpreter when installed), "none" (runc) or a path
    runtime_binary: str = "auto"
    kmod_socket: str = ""  # the kernel stand-in's socket, bind-mounted into containers
    tools_dir: Path = Path(__file__).resolve().parents[2] / "tools"
    sync_interval_s: float = 0.2
    cpu: str = "16"
    memory: str = "64Gi"
    gpu_memory_mib: int = 16384
    host_ip: str = "127.0.0.1"
    labels: dict[str, str] = field(default_factory=dict)
    schedule: bool = False  # also run the simple scheduler in this process
    # a DRA node: DRA drivers register in plugins_registry; the vendor plugin serves discovery
    # only (it does not register, so the kubelet hands out no vendor cards besides DRA)
    dra: bool = False

    @property
    def node_dir(self) -> Path:
        return self.sim_dir / self.name

    @property
    def plugin_dir(self) -> Path:
        return self.node_dir / "device-plugins"

    @property
    def registry_dir(self) -> Path:
        return self.node_dir / "plugins_registry"

    @property
    def pod_resources_socket(self) -> Path:
        return self.node_dir / "pod-resources" / "kubelet.sock"
