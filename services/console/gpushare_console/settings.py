"""The console's own settings (environment prefix ``GPUSHARE_CONSOLE_``)."""

from __future__ import annotations

from dataclasses import dataclass

from gpushare_common.pods import PodRules
from gpushare_common.settings import SettingsError

PREFIX = "GPUSHARE_CONSOLE_"


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    keep: int = 500  # owner-backs and eviction records kept in memory (the newest)
    poll_s: float = 0.2  # how often the event stream is read for new records
    heartbeat_s: float = 2.0  # the key-value watches' idle heartbeat (a lost watch is seen in 3)
    domain: str = "gpushare"
    vendor_resources: tuple[str, ...] = ("nvidia.com/gpu",)
    lendable_key: str = "gpushare.k8s.io/lendable"
    vcpu_millicores: int = 100  # one gpushare/vcpu device, until the node's SpareCapacity says
    vmem_bytes: int = 256 << 20  # one gpushare/vmem device, likewise

    def rules(self, system_namespace: str) -> PodRules:
        return PodRules(domain=self.domain, vendor_resources=self.vendor_resources,
                        lendable_key=self.lendable_key, system_namespace=system_namespace)

    def check(self) -> ConsoleSettings:
        """Itself, or :class:`SettingsError` naming the first variable out of range."""
        for field, value in (("keep", self.keep), ("poll_s", self.poll_s), ("heartbeat_s", self.heartbeat_s),
                             ("vcpu_millicores", self.vcpu_millicores), ("vmem_bytes", self.vmem_bytes)):
            if value <= 0:
                raise SettingsError(f"{PREFIX}{field.upper()}", str(value), "a positive number")
        return self
