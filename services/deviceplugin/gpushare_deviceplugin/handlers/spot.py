"""The spot plugin: one ``spot-<id>`` per real card, Healthy only while lendable."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpushare_common import ids
from gpushare_common.topology import CardTopology

from ..devices import HEALTHY, UNHEALTHY, Health
from ..errors import invalid, not_found
from .base import Annotations, PluginLogic, PreferredRequest, Signer
from .topology import prefer_together


class SpotLogic(PluginLogic):
    """Cards come from the vendor plugins; health from the solver; borrowers from events.

    A spot device is Healthy only when the solver said so *and* its real card is
    present and Healthy at its vendor plugin. A card once seen stays listed
    (Unhealthy) when it disappears, so the kubelet never loses track of it.
    """

    kind = "spot"

    def __init__(self, resource: str, signer: Signer) -> None:
        super().__init__(resource)
        self._signer = signer
        self.cards: dict[str, tuple[str, Health]] = {}  # real id -> (vendor resource, health)
        self.borrowers: dict[str, frozenset[str]] = {}  # borrower pod -> spot device IDs
        self.topology: dict[str, CardTopology] = {}  # real id -> where the card sits

    def set_vendor_cards(self, vendor: str, cards: Mapping[str, Health] | None) -> None:
        """The vendor plugin's full list; ``None`` when its plugin is absent."""
        for real_id, (owner, _) in list(self.cards.items()):
            if owner == vendor and (cards is None or real_id not in cards):
                self.cards[real_id] = (vendor, UNHEALTHY)
        for real_id, health in (cards or {}).items():
            try:
                ids.check_real_device_id(real_id)
            except ids.IdError:
                continue
            self.cards[real_id] = (vendor, HEALTHY if health == HEALTHY else UNHEALTHY)
        self.refresh()

    def set_topology(self, real_id: str, topology: CardTopology) -> None:
        self.topology[real_id] = topology

    def numa_of(self, device_id: str) -> int | None:
        real = device_id.removeprefix(ids.SPOT_PREFIX)
        return self.topology[real].numa_node if real in self.topology else None

    def _group(self, device_id: str) -> str:
        where = self.topology.get(device_id.removeprefix(ids.SPOT_PREFIX))
        if where is None:
            return ""
        return where.pcie_root or ("" if where.numa_node is None else f"numa{where.numa_node}")

    def set_borrowed(self, borrower: str, devices: tuple[str, ...]) -> None:
        if devices:
            self.borrowers[borrower] = frozenset(devices)
        else:
            self.borrowers.pop(borrower, None)

    def borrowed(self) -> set[str]:
        return set().union(*self.borrowers.values())

    def compute(self) -> dict[str, Health]:
        devices: dict[str, Health] = {}
        for real_id, (_, card_health) in self.cards.items():
            spot_id = ids.SPOT_PREFIX + real_id
            wanted = self.desired.get(spot_id, UNHEALTHY)
            devices[spot_id] = HEALTHY if wanted == card_health == HEALTHY else UNHEALTHY
        return devices

    def check_known(self, device_id: str) -> None:
        self._check_format(device_id)
        super().check_known(device_id)

    def _allocate(self, device_ids: list[str]) -> Annotations:
        per_vendor: dict[str, list[str]] = {}
        for device_id in device_ids:
            real_id = ids.parse_spot_device_id(device_id)
            vendor, _ = self.cards.get(real_id, ("", UNHEALTHY))
            if not vendor:
                raise not_found(self.resource, f"no real card behind {device_id!r}")
            per_vendor.setdefault(vendor, []).append(real_id)
        return self._signer.annotations(ids.KIND_IDS, ids.format_devices_ids(per_vendor))

    def _choose(self, candidates: list[str], request: PreferredRequest) -> list[str]:
        """Cards under one PCIe root (else NUMA node) first when several are asked for, then
        idle cards nobody borrows, then cards already lent, then the rest."""
        for device_id in candidates:
            self._check_format(device_id)
        borrowed = self.borrowed()

        def rank(device_id: str) -> int:
            if self.board.health(device_id) != HEALTHY:
                return 2
            return 1 if device_id in borrowed else 0

        need = request.size - len(request.must_include)
        chosen = prefer_together(candidates, need, self._group, rank, request.must_include)
        return [*request.must_include, *chosen]

    def _check_format(self, device_id: str) -> None:
        try:
            ids.parse_spot_device_id(device_id)
        except ids.IdError as err:
            raise invalid(self.resource, str(err)) from None

    def status(self) -> dict[str, Any]:
        vendors = sorted({vendor for vendor, _ in self.cards.values()})
        return {**super().status(), "vendors": vendors, "borrowed": sorted(self.borrowed())}
