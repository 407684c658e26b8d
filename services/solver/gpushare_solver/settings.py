"""The solver's settings: ``GPUSHARE_SOLVER_*`` and the common topics, read once in ``main()``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from gpushare_common.settings import CommonSettings, topic

PREFIX = "GPUSHARE_SOLVER_"


@dataclass(frozen=True, slots=True)
class SolverSettings:
    containerd_address: str = "/run/containerd/containerd.sock"
    """containerd's socket: borrowers' tasks are killed through it."""
    containerd_namespace: str = "k8s.io"
    """The containerd namespace of the kubelet's containers."""
    direct_kill: bool = True
    """Also SIGKILL each task's init through a pidfd (needs hostPID)."""
    # How long an owner may wait for its borrowers is no setting of the solver's: the kernel module's
    # max_hold_ms (read through the kmod-bridge) bounds the hold and the wait for killed tasks.
    kmod_timeout_s: float = 2.0
    """How long one request to the kmod-bridge may take."""
    release_retry_s: float = 3.0
    """Keep trying to deliver a release this long (then the kernel's own timeout releases)."""
    ack_wait_s: float = 30.0
    """How long the stream waits for an event's acknowledgement before it redelivers it."""
    consumer_check_s: float = 30.0
    """How often the durable consumer is checked against its declaration (and healed when changed)."""
    retry_first_s: float = 0.05
    """The first delay before a failed event is handled again (doubling up to retry_max_s)."""
    retry_max_s: float = 5.0
    """The longest delay between two attempts at a failed event."""
    spot_resource: str = "spot-gpu"
    """The device plugin resource (without its domain) whose devices are lent cards."""
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    """The kubelet's pod-resources API: at an owner-back, the pods holding the owner's spot devices
    that the solver has not heard of yet are found there and killed before the release ("": off)."""
    pod_resources_timeout_s: float = 1.0
    """How long one pod-resources call may take."""
    fence_timeout_s: float = 0.5
    """Before that lookup the device plugin is asked to refuse Allocate of those spot devices (a
    fence); its answer is awaited this long (a node without a device plugin answers at once)."""
    seen_events: int = 2048
    """Event ids remembered for idempotency."""
    memory_threshold: float = 0.70
    """The share of the node's memory in use above which oversold pods are evicted."""
    cpu_threshold: float = 0.90
    """The share of the node's CPU in use above which oversold pods are evicted."""
    pressure_cooldown_s: float = 30.0
    """The least time between two pressure evictions."""
    signing_key_file: str = ""
    """The node key of the device plugin and the runtime: when set, an empty mapping bucket is also
    rebuilt with the borrowers whose pods carry a signed spot Allocate annotation."""
    rebuild_holdoff_s: float = 200.0
    """After a rebuild on a node with pods holding cards, the card inventory lends nothing for this
    long: who holds each card comes with the detector's republication (at most the stream's
    duplicate window plus one resync)."""
    dra_taints: bool = False
    """A DRA node: after an owner-back, taint the card's spot device NoExecute until it is lent again."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the solver reads."""

    DEFAULT_PORT: ClassVar[int] = 8082
    common: CommonSettings = field(default_factory=CommonSettings)
    solver: SolverSettings = topic(SolverSettings, PREFIX)
