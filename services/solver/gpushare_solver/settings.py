"""The solver's own settings (environment prefix ``GPUSHARE_SOLVER_``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SolverSettings:
    containerd_address: str = "/run/containerd/containerd.sock"
    containerd_namespace: str = "k8s.io"
    direct_kill: bool = True  # also SIGKILL the task's init through a pidfd (needs hostPID)
    kill_timeout_s: float = 10.0  # wait this long for killed tasks to exit
    release_deadline_s: float = 2.0  # release the owner at the latest this long after the kill began
    kmod_timeout_s: float = 2.0
    durable: str = "solver"
    max_deliver: int = 5
    ack_wait_s: float = 30.0
    retry_delay_s: float = 0.5
    spot_resource: str = "spot-gpu"
    seen_events: int = 2048  # event ids remembered for idempotency
    memory_threshold: float = 0.70
    cpu_threshold: float = 0.90
    pressure_cooldown_s: float = 30.0
    # the node key of the device plugin and the runtime: when set, an empty mapping bucket is also
    # rebuilt with the borrowers whose pods carry a signed spot Allocate annotation
    signing_key_file: str = ""
    # after a rebuild on a node with pods holding cards, the card inventory lends nothing for this
    # long: who holds each card comes with the detector's republication (at most the stream's
    # duplicate window plus one resync)
    rebuild_holdoff_s: float = 200.0


def bucket_names(node_token: str) -> dict[str, str]:
    """The key-value buckets (after the KV prefix) the solver uses for one node.

    ``health`` is shared with the device plugin: key ``<node>/<resource>``, value a
    full :class:`DeviceHealth` (see :func:`health_key`).
    """
    return {
        "mapping": f"mapping-{node_token}",
        "health": "health",
        "plans": f"plans-{node_token}",
        "journal": f"solver-{node_token}",
    }


def health_key(node: str, resource: str) -> str:
    return f"{node}/{resource}"
