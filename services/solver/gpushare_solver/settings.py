"""The solver's own settings (environment prefix ``GPUSHARE_SOLVER_``)."""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "GPUSHARE_SOLVER_"


@dataclass(frozen=True, slots=True)
class SolverSettings:
    containerd_address: str = "/run/containerd/containerd.sock"
    containerd_namespace: str = "k8s.io"
    direct_kill: bool = True  # also SIGKILL the task's init through a pidfd (needs hostPID)
    # How long an owner may wait for its borrowers. Both match the module's max_hold_ms (30 s): a
    # real GPU borrower's exit waits for the driver to free its memory, and the owner's call must
    # not continue beside it. The owner is released as soon as the borrowers are dead.
    kill_timeout_s: float = 30.0  # wait this long for killed tasks to exit
    release_deadline_s: float = 30.0  # release the owner at the latest this long after the kill began
    kmod_timeout_s: float = 2.0
    release_retry_s: float = 3.0  # keep trying to deliver a release this long (then the kernel's timeout)
    ack_wait_s: float = 30.0
    retry_first_s: float = 0.05  # redelivery of a failed event: first delay, doubling to retry_max_s
    retry_max_s: float = 5.0
    spot_resource: str = "spot-gpu"
    # the kubelet's pod-resources API: at an owner-back, the pods holding the owner's spot devices
    # that the solver has not heard of yet are found there and killed before the release ("" : off)
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    pod_resources_timeout_s: float = 1.0
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
    # a DRA node: after an owner-back, taint the card's spot device NoExecute until it is lent again
    dra_taints: bool = False
