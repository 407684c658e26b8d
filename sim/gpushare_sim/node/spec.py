"""From a pod, one of its containers and what the device plugins answered, to
the container spec a runner starts (pure, apart from creating the report dir).

Annotations: every pod annotation, then the Allocate annotations, then the CRI
identity (``io.kubernetes.cri.sandbox-namespace``, ``-name``,
``container-name``), as containerd's CRI plugin would write them for a runner
that writes the OCI spec itself (its handler letting every key through); a CRI
runner hands the pod's and the Allocate's annotations to containerd apart.
Environment: the container's own, the Allocate envs, and for the workload
program ``GPULOAD_REPORT_DIR`` (a per-container directory the exporter reads)
and ``GPULOAD_KMOD_SOCK`` (the kernel stand-in's socket) when configured.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpushare_sim.node.adapters.deviceplugins import ContainerAllocation
from gpushare_sim.node.model import BindMount, ContainerDef, ContainerSpec, PodDef

CRI_NAMESPACE = "io.kubernetes.cri.sandbox-namespace"
CRI_POD = "io.kubernetes.cri.sandbox-name"
CRI_CONTAINER = "io.kubernetes.cri.container-name"
CRI_CONTAINER_TYPE = "io.kubernetes.cri.container-type"
CRI_POD_UID = "io.kubernetes.cri.sandbox-uid"

REPORT_DIR_IN_CONTAINER = "/run/gpuload"
KMOD_DIR_IN_CONTAINER = "/run/gpushare-kmod"
REPORT_ENV = "GPULOAD_REPORT_DIR"
KMOD_ENV = "GPULOAD_KMOD_SOCK"


@dataclass(frozen=True, slots=True)
class SpecContext:
    node_dir: Path
    host_ip: str = "127.0.0.1"
    kmod_socket: Path | None = None


def container_dir(node_dir: Path, container_id: str) -> Path:
    """Where a container's files live: its OCI bundle or working directory, and `log`, its output."""
    return node_dir / "containers" / container_id[:16]


def report_dir(node_dir: Path, namespace: str, pod: str, container: str) -> Path:
    return node_dir / "util" / namespace / pod / container


def container_annotations(pod: PodDef, container: ContainerDef, allocation: ContainerAllocation) -> dict[str, str]:
    return {
        **pod.annotations,
        **allocation.annotations,
        CRI_CONTAINER_TYPE: "container",
        CRI_NAMESPACE: pod.namespace,
        CRI_POD: pod.name,
        CRI_POD_UID: pod.uid,
        CRI_CONTAINER: container.name,
    }


def container_spec(
    ctx: SpecContext,
    pod: PodDef,
    container: ContainerDef,
    allocation: ContainerAllocation,
    container_id: str,
    attempt: int = 0,
) -> ContainerSpec:
    reports = report_dir(ctx.node_dir, pod.namespace, pod.name, container.name)
    reports.mkdir(parents=True, exist_ok=True)
    mounts = [*allocation.mounts, BindMount(REPORT_DIR_IN_CONTAINER, str(reports))]
    env = {**container.env, **allocation.envs, REPORT_ENV: REPORT_DIR_IN_CONTAINER}
    if ctx.kmod_socket is not None:
        ctx.kmod_socket.parent.mkdir(parents=True, exist_ok=True)
        mounts.append(BindMount(KMOD_DIR_IN_CONTAINER, str(ctx.kmod_socket.parent)))
        env[KMOD_ENV] = f"{KMOD_DIR_IN_CONTAINER}/{ctx.kmod_socket.name}"
    return ContainerSpec(
        container_id=container_id,
        args=container.args or ["sleep", "infinity"],
        env=env,
        devices=list(allocation.devices),
        mounts=mounts,
        annotations=container_annotations(pod, container, allocation),
        workdir=container_dir(ctx.node_dir, container_id),
        pod=pod,
        name=container.name,
        attempt=attempt,
        allocated_annotations=dict(allocation.annotations),
    )
