"""Topology on the device-plugin path: spot-gpu reports each card's NUMA node, and asks for
several cards are served under one PCIe root (or NUMA node), idle cards first."""

from __future__ import annotations

from pathlib import Path

from gpushare_common.adapters.vendorplugin import VendorCard
from gpushare_common.settings import CommonSettings, HttpSettings, KubeSettings, LogSettings, NatsSettings, NodeSettings
from gpushare_common.topology import CardTopology
from gpushare_common.vendors import DEFAULT_VENDORS
from gpushare_deviceplugin.adapters.kubelet import list_response
from gpushare_deviceplugin.app import Service
from gpushare_deviceplugin.handlers.base import PreferredRequest, Signer
from gpushare_deviceplugin.handlers.spot import SpotLogic
from gpushare_deviceplugin.handlers.topology import prefer_together
from gpushare_deviceplugin.settings import DevicePluginSettings
from hypothesis import given
from hypothesis import strategies as st

from tests.dra.builders import NODE, fake_host

KEY = b"k" * 32
ROOTS = {0: "pci0000:00", 1: "pci0000:00", 2: "pci0000:80", 3: "pci0000:80"}


def spot(borrowed: tuple[str, ...] = ()) -> SpotLogic:
    logic = SpotLogic("gpushare/spot-gpu", Signer(KEY, NODE))
    logic.set_vendor_cards("nvidia.com/gpu", {f"GPU-{i}": "Healthy" for i in range(4)})
    for index, root in ROOTS.items():
        logic.set_topology(f"GPU-{index}", CardTopology(f"0000:{index:02x}:00.0", index // 2, root))
    logic.apply_health({f"spot-GPU-{i}": "Healthy" for i in range(4)}, full=True)
    if borrowed:
        logic.set_borrowed("ns/borrower/main", borrowed)
    return logic


def preferred(logic: SpotLogic, size: int, must: tuple[str, ...] = ()) -> list[str]:
    available = tuple(f"spot-GPU-{i}" for i in range(4))
    return logic.preferred([PreferredRequest(available, must, size)])[0]


def test_two_cards_come_from_one_pcie_root_idle_first() -> None:
    assert preferred(spot(), 2) == ["spot-GPU-0", "spot-GPU-1"]
    assert preferred(spot(borrowed=("spot-GPU-0",)), 2) == ["spot-GPU-2", "spot-GPU-3"]
    assert preferred(spot(), 2, must=("spot-GPU-3",)) == ["spot-GPU-3", "spot-GPU-2"]
    assert sorted(preferred(spot(borrowed=("spot-GPU-1",)), 3)) == ["spot-GPU-0", "spot-GPU-2", "spot-GPU-3"]
    assert preferred(spot(borrowed=("spot-GPU-0",)), 1) == ["spot-GPU-1"]


def test_numa_groups_when_the_root_is_unknown_and_numa_in_the_list() -> None:
    logic = spot()
    for index in range(4):
        logic.set_topology(f"GPU-{index}", CardTopology("", 1 - index // 2, ""))
    assert preferred(logic, 2) == ["spot-GPU-0", "spot-GPU-1"]
    response = list_response(logic.board, logic.numa_of)
    assert [(d.ID, [n.ID for n in d.topology.nodes]) for d in response.devices] == \
        [("spot-GPU-0", [1]), ("spot-GPU-1", [1]), ("spot-GPU-2", [0]), ("spot-GPU-3", [0])]
    assert not list_response(logic.board).devices[0].HasField("topology")


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 2)), min_size=1, max_size=8),
       st.integers(0, 8))
def test_the_choice_is_together_when_it_can_be(cards: list[tuple[str, int]], need: int) -> None:
    names = [f"d{i}" for i in range(len(cards))]
    group = dict(zip(names, (g for g, _ in cards), strict=True))
    rank = dict(zip(names, (r for _, r in cards), strict=True))
    need = min(need, len(names))
    chosen = prefer_together(names, need, group.__getitem__, rank.__getitem__)
    assert len(chosen) == need == len(set(chosen)) and set(chosen) <= set(names)
    if any(list(group.values()).count(g) >= need for g in group.values()) and need:
        assert len({group[d] for d in chosen}) == 1


def test_the_service_reads_topology_from_sysfs_then_the_vendor_plugin(tmp_path: Path) -> None:
    fake_host(tmp_path, cards=4)
    settings = DevicePluginSettings(host_root=str(tmp_path), plugin_dir=str(tmp_path / "dp"))
    common = CommonSettings(NatsSettings(), HttpSettings(), LogSettings(), NodeSettings(NODE), KubeSettings())
    service = Service(common, settings, KEY, vendors=dict(DEFAULT_VENDORS))
    assert service._topology("nvidia.com/gpu", VendorCard(f"GPU-{NODE}-2", True, (7,))) == \
        CardTopology("0000:3d:00.0", 1, "pci0000:80")
    assert service._topology("nvidia.com/gpu", VendorCard("GPU-elsewhere", True, (7,))) == CardTopology("", 7, "")
