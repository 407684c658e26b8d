"""Spot on a DRA node: a spot device whose owner came back is tainted ``NoExecute``.

After an owner-back the borrowers are killed and the owner released exactly as on the
device-plugin path; then a DeviceTaintRule (resource.k8s.io/v1alpha3) selects the card's spot
device in the DRA driver's pool (the node), so that Kubernetes evicts what still holds it and
allocates it to nobody until the card is lent again, when the rule goes. Only on nodes that
set ``GPUSHARE_SOLVER_DRA_TAINTS``; a failed write is logged (the driver has already withdrawn
the spot device from the node's slice, so nothing is lent meanwhile).
"""

from __future__ import annotations

from typing import Any, Protocol

from gpushare_common import dra
from gpushare_common.adapters.kube import KubeError, NotFound
from gpushare_common.ids import IdError, parse_spot_device_id
from gpushare_common.logging import get_logger

log = get_logger("solver.taints")
Obj = dict[str, Any]
TAINT_KEY = f"{dra.DRIVER}/owner-back"
MANAGED_BY = "gpushare-solver"


class TaintApi(Protocol):
    async def create_device_taint_rule(self, body: Obj) -> Obj: ...
    async def delete_device_taint_rule(self, name: str) -> None: ...


def rule_name(node: str, spot_device: str) -> str:
    """``gpushare-owner-back-<node>-<device>``: one rule per spot device of the node."""
    return f"gpushare-owner-back-{node}-{dra.spot_device_name(parse_spot_device_id(spot_device))}"[:253]


def taint_rule(node: str, spot_device: str, owner: str) -> Obj:
    card = parse_spot_device_id(spot_device)
    return {
        "apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceTaintRule",
        "metadata": {"name": rule_name(node, spot_device),
                     "labels": {"app.kubernetes.io/managed-by": MANAGED_BY, f"{dra.DRIVER}/node": node}},
        "spec": {"deviceSelector": {"driver": dra.DRIVER, "pool": node, "device": dra.spot_device_name(card)},
                 "taint": {"key": TAINT_KEY, "value": owner.replace("/", ".")[:63] or "owner",
                           "effect": "NoExecute"}},
    }


class DeviceTaints:
    def __init__(self, node: str, api: TaintApi) -> None:
        self.node = node
        self.api = api

    async def taint(self, spot_devices: list[str], owner: str) -> None:
        for device in spot_devices:
            try:
                body = taint_rule(self.node, device, owner)
                await self.api.create_device_taint_rule(body)
            except IdError:
                continue
            except KubeError as err:
                if err.status != 409:  # already tainted
                    log.warning("spot device not tainted", node=self.node, device=device, error=str(err))
                    continue
            log.info("spot device tainted NoExecute", node=self.node, device=device, owner=owner)

    async def untaint(self, spot_devices: list[str]) -> None:
        for device in spot_devices:
            try:
                await self.api.delete_device_taint_rule(rule_name(self.node, device))
            except (IdError, NotFound):
                continue
            except KubeError as err:
                log.warning("spot device taint not removed", node=self.node, device=device, error=str(err))
                continue
            log.info("spot device taint removed: lent again", node=self.node, device=device)
