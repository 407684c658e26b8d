"""The console's settings: ``GPUSHARE_CONSOLE_*`` and the common topics, read once in ``main()``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from gpushare_common.pods import PodRules
from gpushare_common.settings import CommonSettings, SettingsError, topic

PREFIX = "GPUSHARE_CONSOLE_"


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    keep: int = 500
    """Owner-backs and eviction records kept in memory (the newest)."""
    instance: str = "console"
    """This console's name on NATS (its pod's, in Kubernetes): it names the consumers it follows the
    buckets through, which only this instance may create (the auth callout grants the token's pod)."""
    poll_s: float = 0.2
    """How often the event stream is read for new records."""
    heartbeat_s: float = 2.0
    """The key-value watches' idle heartbeat (a lost watch is seen in 3)."""
    node_domains: bool = True
    """Follow each node's stream and buckets on its leaf server (its JetStream domain); false: one
    server holds every node's."""
    dra: bool = False
    """Follow ResourceClaims and gpushare's ResourceSlices (a cluster serving ``resource.k8s.io/v1``;
    the chart sets it with ``dra.enabled``): a DRA card's claims, shares and spot mirror."""
    auth: str = "none"
    """Who may look (guard.py): ``none`` (whoever reaches it: the chart keeps it in the cluster) or
    ``token`` (a bearer token the Kubernetes API authenticates)."""
    viewers: tuple[str, ...] = ()
    """With ``auth`` token: only these users (``name``) or groups (``group:name``); empty: anyone."""
    review_cache_s: float = 30.0
    """How long a token's verdict is kept (by the token's hash)."""
    max_streams: int = 64
    """Live update streams open at once (one more is refused: 503)."""
    domain: str = "gpushare"
    """The domain of gpushare's resources and annotations (``<domain>/share-gpu-4``, ...)."""
    vendor_resources: tuple[str, ...] = ("nvidia.com/gpu",)
    """The vendors' card resources pods request."""
    lendable_key: str = "gpushare.k8s.io/lendable"
    """The label or annotation that marks a lendable dev machine."""
    vcpu_millicores: int = 100
    """The size of one gpushare/vcpu device, until the node's spare capacity says."""
    vmem_bytes: int = 256 << 20
    """The size of one gpushare/vmem device, until the node's spare capacity says."""

    def __post_init__(self) -> None:
        for name in ("keep", "poll_s", "heartbeat_s", "vcpu_millicores", "vmem_bytes", "review_cache_s",
                     "max_streams"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{PREFIX}{name.upper()}", str(getattr(self, name)), "a positive number")
        if self.auth not in ("none", "token"):
            raise SettingsError(f"{PREFIX}AUTH", self.auth, "none or token")

    def rules(self, system_namespace: str) -> PodRules:
        return PodRules(domain=self.domain, vendor_resources=self.vendor_resources,
                        lendable_key=self.lendable_key, system_namespace=system_namespace)


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the console reads."""

    DEFAULT_PORT: ClassVar[int] = 8080
    common: CommonSettings = field(default_factory=CommonSettings)
    console: ConsoleSettings = topic(ConsoleSettings, PREFIX)
