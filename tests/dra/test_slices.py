"""The node's cards and its ResourceSlice: topology from sysfs, attributes, capacity, spot mirrors."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpushare_common import dra
from gpushare_common.adapters.vendorplugin import VendorCard
from gpushare_common.topology import CardTopology, card_topology, is_pci_bus_id
from gpushare_common.vendors import DEFAULT_VENDORS, VendorResource, parse_vendor
from gpushare_dra_driver.cards import CardError, build_cards
from gpushare_dra_driver.inventory import Inventory
from gpushare_dra_driver.slices import UNHEALTHY_TAINT, build_slice, lendable_cards

from tests.dra.builders import GPU, NODE, card, fake_host

NVIDIA = DEFAULT_VENDORS[GPU]


def test_topology_from_the_vendor_table_and_sysfs(tmp_path: Path) -> None:
    root = str(fake_host(tmp_path, cards=4))
    found = [card_topology(NVIDIA, f"GPU-{NODE}-{i}", root) for i in range(4)]
    assert [t.pci_bus_id for t in found] == ["0000:3b:00.0", "0000:3c:00.0", "0000:3d:00.0", "0000:3e:00.0"]
    assert [t.pcie_root for t in found] == ["pci0000:00", "pci0000:00", "pci0000:80", "pci0000:80"]
    assert [t.numa_node for t in found] == [0, 0, 1, 1]
    assert card_topology(NVIDIA, "GPU-unknown", root) == CardTopology()


def test_topology_by_template_and_unknowns(tmp_path: Path) -> None:
    root = str(fake_host(tmp_path, cards=1))
    amd = parse_vendor("amd.com/gpu", {"topology": {"pci_bus_id": "{id}"}})
    assert card_topology(amd, "0000:3b:00.0", root).pcie_root == "pci0000:00"
    assert card_topology(amd, "not-an-address", root) == CardTopology()
    assert card_topology(VendorResource("x.com/y"), "0000:3b:00.0", root) == CardTopology()
    (tmp_path / "sys/bus/pci/devices/0000:3b:00.0/numa_node").write_text("-1\n")
    assert card_topology(amd, "0000:3b:00.0", root).numa_node is None  # no NUMA affinity
    assert is_pci_bus_id("0000:3b:00.0") and not is_pci_bus_id("0000:3b:00") and not is_pci_bus_id("3b:00.0")


@pytest.mark.parametrize("doc, field", [
    ({"topology": {"pci_bus_id": "no-placeholder"}}, "pci_bus_id"),
    ({"topology": {"pci_bus_id": {"glob": "relative/*", "line": "{id}"}}}, "glob"),
    ({"topology": {"pci_bus_id": {"glob": "/a/*/b/*", "line": "{id}"}}}, "glob"),
    ({"topology": {"pci": "{id}"}}, "topology"),
])
def test_bad_topology_entries_name_the_field(doc: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        parse_vendor("amd.com/gpu", doc)


def _cards(tmp_path: Path, healthy: dict[str, bool] | None = None) -> list[object]:
    root = str(fake_host(tmp_path, cards=4))
    listed = {GPU: {f"GPU-{NODE}-{i}": VendorCard(f"GPU-{NODE}-{i}", (healthy or {}).get(str(i), True))
                    for i in (3, 1, 0, 2)}}
    return build_cards(listed, lambda v, c: card_topology(NVIDIA, c, root), {GPU: 40960}, {GPU: "A100"})  # type: ignore[return-value]


def test_cards_are_indexed_in_pci_order_with_topology(tmp_path: Path) -> None:
    cards = _cards(tmp_path)
    assert [(c.index, c.id) for c in cards] == [(i, f"GPU-{NODE}-{i}") for i in range(4)]  # type: ignore[attr-defined]
    assert {c.topology.pcie_root for c in cards[2:]} == {"pci0000:80"}  # type: ignore[attr-defined]


def test_numa_from_the_vendor_plugin_when_sysfs_does_not_say() -> None:
    listed = {GPU: {"GPU-a": VendorCard("GPU-a", True, (1,))}}
    (built,) = build_cards(listed, lambda v, c: CardTopology(), {}, {})
    assert built.numa_node == 1


def test_cards_that_cannot_be_named_are_refused() -> None:
    with pytest.raises(CardError, match="CDI device name"):
        build_cards({GPU: {"GPU/0": VendorCard("GPU/0", True)}}, lambda v, c: CardTopology(), {}, {})
    with pytest.raises(CardError, match="same DRA device name"):
        build_cards({GPU: {"GPU-A": VendorCard("GPU-A", True), "gpu-a": VendorCard("gpu-a", True)}},
                    lambda v, c: CardTopology(), {}, {})


def test_slice_lists_every_card_with_attributes_and_consumable_shares(tmp_path: Path) -> None:
    cards = _cards(tmp_path, healthy={"2": False})
    body = build_slice(NODE, dra.DRIVER, cards, 100, set(), generation=3)  # type: ignore[arg-type]
    spec = body["spec"]
    assert spec["pool"] == {"name": NODE, "generation": 3, "resourceSliceCount": 1}
    assert spec["nodeName"] == NODE and spec["driver"] == dra.DRIVER
    devices = {d["name"]: d for d in spec["devices"]}
    assert sorted(devices) == [f"gpu-{NODE}-{i}" for i in range(4)]
    first = devices[f"gpu-{NODE}-0"]
    assert first["allowMultipleAllocations"] is True
    assert first["capacity"] == {"shares": {"value": "100", "requestPolicy": {
        "default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}}}}
    assert first["attributes"] == {
        "kind": {"string": "card"}, "vendor": {"string": GPU}, "uuid": {"string": f"GPU-{NODE}-0"},
        "index": {"int": 0}, "model": {"string": "A100"}, "memoryMiB": {"int": 40960},
        dra.PCI_BUS_ID: {"string": "0000:3b:00.0"}, dra.PCIE_ROOT: {"string": "pci0000:00"},
        dra.NUMA_NODE: {"int": 0}}
    assert devices[f"gpu-{NODE}-2"]["taints"] == [UNHEALTHY_TAINT]
    assert "taints" not in first


def test_spot_mirrors_only_for_cards_the_solver_lends(tmp_path: Path) -> None:
    cards = _cards(tmp_path, healthy={"3": False})
    health = {f"spot-GPU-{NODE}-1": "Healthy", f"spot-GPU-{NODE}-2": "Unhealthy",
              f"spot-GPU-{NODE}-3": "Healthy"}
    lendable = lendable_cards(cards, health)  # type: ignore[arg-type]
    assert lendable == {f"GPU-{NODE}-1"}  # card 3 is unhealthy itself
    devices = build_slice(NODE, dra.DRIVER, cards, 100, lendable, 1)["spec"]["devices"]  # type: ignore[arg-type]
    spot = [d for d in devices if d["attributes"]["kind"] == {"string": "spot"}]
    assert [d["name"] for d in spot] == [f"spot-gpu-{NODE}-1"]
    assert "capacity" not in spot[0] and "allowMultipleAllocations" not in spot[0]
    assert spot[0]["attributes"]["uuid"] == {"string": f"GPU-{NODE}-1"}


def test_inventory_keeps_cards_unhealthy_while_their_plugin_is_away() -> None:
    inventory = Inventory(NODE, lambda v, c: CardTopology(), {}, {})
    assert inventory.update(GPU, {"GPU-0": VendorCard("GPU-0", True)})
    (first,) = inventory.events()
    assert first.devices == ("GPU-0",) and inventory.events() == []
    assert inventory.update(GPU, None) and not inventory.cards[0].healthy
    assert not inventory.update(GPU, None)
    assert inventory.events() == []  # the same cards: no new inventory
    assert inventory.update(GPU, {})
    (gone,) = inventory.events()
    assert gone.devices == () and gone.id != first.id
    inventory.update(GPU, {"GPU-0": VendorCard("GPU-0", True)})
    (back,) = inventory.events()
    assert back.devices == ("GPU-0",) and back.id != first.id  # back to an earlier set: a new id
    (shared,) = inventory.events(frozenset({"GPU-0", "GPU-elsewhere"}))  # shares prepared on GPU-0
    assert shared.shared == ("GPU-0",) and shared.id != back.id and inventory.events(frozenset({"GPU-0"})) == []
    (free,) = inventory.events()
    assert free.shared == () and free.devices == ("GPU-0",)
    assert card(0).name == f"gpu-{NODE}-0"
