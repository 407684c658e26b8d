"""The kubelet's word on a pod the solver is about to kill: no kill rests on one service's word.

A pod goes on the eviction ledger because an event said so (a SpotEvent of the detector, a
ShareEvent, a capacity sample): a compromised detector can write the ledger. The kubelet's
pod-resources API cannot be written that way, so before any kill the solver asks it (one
``List`` per reclaim) and a pod must be listed holding one of the devices it was recorded with
(any gpushare device when it was recorded with none, a pressure eviction). What it does not
confirm is refused, counted by reason (``gpushare_solver_evictions_refused{why}``).
"""

from __future__ import annotations

from gpushare_common.adapters.podresources import NodeDevices, PodResourcesError
from gpushare_common.logging import get_logger
from gpushare_common.pods import PodRules

from .actions import Reclaim
from .metrics import SolverMetrics
from .ports import Allocations
from .state import Victim

log = get_logger("solver.confirm")
NOT_ON_KUBELET = "not-on-this-kubelet"
NO_KUBELET = "no-kubelet-configured"  # pod_resources_socket "": nothing is confirmed, nothing killed
KUBELET_UNREADABLE = "kubelet-unreadable"  # counted per reclaim tried while the kubelet cannot answer


def unconfirmed(victim: Victim | None, held: frozenset[str] | None, domain_held: frozenset[str]) -> str:
    """Why the kubelet does not confirm a pod as a borrower or sharer ("" when it does): it lists
    no such pod on this node (``held`` None), or the pod holds none of the devices it was recorded
    with, or — recorded with none (pressure) — no gpushare device at all (``domain_held``)."""
    if held is None:
        return NOT_ON_KUBELET
    recorded = set(victim.devices) if victim is not None else set()
    if recorded:
        return "" if recorded & held else "not-holding-its-devices"
    return "" if domain_held else "holds-no-gpushare-device"


class Kubelet:
    """The node's kubelet, as the reclaim asks it (``allocations`` None: no kubelet configured)."""

    def __init__(self, node: str, allocations: Allocations | None, rules: PodRules, metrics: SolverMetrics) -> None:
        self.node = node
        self.allocations = allocations
        self.rules = rules
        self.metrics = metrics

    async def listing(self, action: Reclaim) -> NodeDevices | None:
        """Pod-resources now (None: no kubelet). One that cannot answer stops the reclaim before
        anything is killed (the error propagates: the plan is tried again)."""
        if self.allocations is None:
            return None
        try:
            return await self.allocations.list()
        except PodResourcesError as err:
            self.metrics.refused.labels(KUBELET_UNREADABLE).inc()
            log.warning("pod-resources unreadable: nothing is killed until the kubelet confirms it; retrying",
                        node=self.node, owner=action.owner, pods=",".join(action.pods), error=str(err))
            raise

    def confirm(self, pod: str, victim: Victim | None, listing: NodeDevices | None) -> str:
        """Why the kubelet does not confirm ``pod`` ("" when it does)."""
        if listing is None:
            return NO_KUBELET
        containers = listing.get(pod)
        if containers is None:
            return unconfirmed(victim, None, frozenset())
        held = self.rules.claimed_devices(containers)
        ours = frozenset(d for resources in held.values() for r, found in resources.items()
                         if r.startswith(f"{self.rules.domain}/") for d in found)
        return unconfirmed(victim, frozenset(d for r in held.values() for ds in r.values() for d in ds), ours)
