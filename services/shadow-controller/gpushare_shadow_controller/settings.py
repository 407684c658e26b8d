"""The shadow-controller's settings: ``GPUSHARE_SHADOW_*``, HTTP, logs and the API server, read once
in ``main()``."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gpushare_common.isolation import MPS, is_profile_name
from gpushare_common.pods import SHARE_KINDS, parse_share_resource
from gpushare_common.settings import (
    HTTP_PREFIX,
    KUBE_PREFIX,
    LOG_PREFIX,
    HttpSettings,
    KubeSettings,
    LogSettings,
    SettingsError,
    topic,
)

PREFIX = "GPUSHARE_SHADOW_"


@dataclass(frozen=True, slots=True)
class ShadowSettings:
    domain: str = "gpushare"
    """The domain of the share resources served (``<domain>/share-gpu-4``, ...)."""
    namespaces: tuple[str, ...] = ()
    """The tenants' namespaces served (empty: every namespace)."""
    image: str = "registry.k8s.io/pause:3.10"
    """The ShadowPods' image (they only hold a card)."""
    priority_class: str = ""
    """The ShadowPods' priority class ("": none)."""
    vendor_resource: str = "nvidia.com/gpu"
    """The vendor resource a ShadowPod holds one card of."""
    runtime_class: str = ""
    """The ShadowPods' runtime class ("": the node's default)."""
    tolerations: str = "[]"
    """The ShadowPods' tolerations: a JSON list of Kubernetes tolerations."""
    node_selector: str = ""
    """The ShadowPods' node selector: comma-separated key=value."""
    idle_timeout_s: float = 300.0
    """A ShadowPod no SharePod uses is retired after this long."""
    resync_s: float = 30.0
    """Reconcile at least this often, changes or not."""
    expected_ttl_s: float = 60.0
    """Forget a created ShadowPod the watch has not shown after this long."""
    lease_namespace: str = "gpushare-system"
    """The namespace of the leader election's Lease."""
    lease_name: str = "gpushare-shadow-controller"
    """The leader election's Lease."""
    lease_duration_s: float = 15.0
    """How long a leader's Lease holds without renewal."""
    renew_every_s: float = 5.0
    """How often the leader renews its Lease."""
    identity: str = ""
    """This replica's name in the Lease ("": hostname and pid)."""
    mps_kinds: tuple[str, ...] = ()
    """Hard caps: the share kinds (share, share-dev) whose ShadowPods run NVIDIA's MPS control daemon
    for their card."""
    mps_image: str = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"
    """The image the MPS daemon runs in (any with a POSIX shell: the driver's MPS binaries and
    nvidia-smi come with the card)."""
    mps_script: str = ""
    """The daemon's shell script ("": the built-in one; the chart passes the same)."""
    isolation_host_path: str = "/run/gpushare/isolation"
    """The host directory holding each ShadowPod's pipe, log and shm directories on the node (the
    runtime's isolation_dir; not a path in this container)."""
    isolation_profiles: dict[str, str] = field(default_factory=dict)
    """Isolation profiles of the nodes' vendor table by share kind or by share resource, e.g.
    share-dev=npu_caps,share-gpu-3=mps (a resource wins over its kind): the ShadowPods' annotation
    gpushare.k8s.io/isolation, which the device plugin signs into each share's caps and the runtime
    computes them from; "mps" also runs the MPS daemon, as mps_kinds does."""

    def __post_init__(self) -> None:
        for kind in self.mps_kinds:
            if kind not in ("share", "share-dev"):
                raise SettingsError("GPUSHARE_SHADOW_MPS_KINDS", kind, "share and/or share-dev")
        for key, profile in self.isolation_profiles.items():
            pair = f"{key}={profile}"
            if key not in SHARE_KINDS and parse_share_resource(f"{self.domain}/{key}", self.domain) is None:
                raise SettingsError("GPUSHARE_SHADOW_ISOLATION_PROFILES", pair, "share, share-dev or a share "
                                    "resource without its domain (share-gpu-<N>, share-dev-gpu-<N>) before =")
            if not is_profile_name(profile):
                raise SettingsError("GPUSHARE_SHADOW_ISOLATION_PROFILES", pair, "an isolation profile name "
                                    "(letters, digits and _, not 'none': a soft share needs no entry) after =")
            if key in self.mps_kinds:
                raise SettingsError("GPUSHARE_SHADOW_ISOLATION_PROFILES", pair, "a share kind not in "
                                    "GPUSHARE_SHADOW_MPS_KINDS (name it in one of the two)")
        if not self.isolation_host_path.startswith("/") or "/../" in self.isolation_host_path + "/":
            raise SettingsError("GPUSHARE_SHADOW_ISOLATION_HOST_PATH", self.isolation_host_path,
                                "an absolute path")
        self.tolerations_list()
        self.node_selector_map()

    def tolerations_list(self) -> list[dict[str, Any]]:
        try:
            value = json.loads(self.tolerations)
        except ValueError as err:
            raise SettingsError("GPUSHARE_SHADOW_TOLERATIONS", self.tolerations,
                                f"a JSON list of tolerations ({err})") from None
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise SettingsError("GPUSHARE_SHADOW_TOLERATIONS", self.tolerations, "a JSON list of objects")
        return value

    def node_selector_map(self) -> dict[str, str]:
        pairs = [p for p in self.node_selector.split(",") if p.strip()]
        result = {}
        for pair in pairs:
            key, eq, value = pair.partition("=")
            if not eq or not key.strip():
                raise SettingsError("GPUSHARE_SHADOW_NODE_SELECTOR", self.node_selector, "key=value,...")
            result[key.strip()] = value.strip()
        return result

    def isolation_of(self, kind: str, spec: int) -> str:
        """The isolation profile of the ShadowPods of this share kind and N; "" for a soft share."""
        resource = f"{SHARE_KINDS.get(kind, kind)}-{spec}"
        profile = self.isolation_profiles.get(resource) or self.isolation_profiles.get(kind)
        return profile or (MPS if kind in self.mps_kinds else "")

    def who(self) -> str:
        return self.identity or f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the shadow-controller reads (it does not use NATS)."""

    DEFAULT_PORT: ClassVar[int] = 8084
    shadow: ShadowSettings = topic(ShadowSettings, PREFIX)
    kube: KubeSettings = topic(KubeSettings, KUBE_PREFIX)
    http: HttpSettings = topic(HttpSettings, HTTP_PREFIX)
    log: LogSettings = topic(LogSettings, LOG_PREFIX)
