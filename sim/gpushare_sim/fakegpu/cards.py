"""Fake GPU cards: character device nodes and their CDI spec.

Each card ``i`` of node ``<node>`` is a character device node
``<node dir>/dev/nvidia<i>`` with the major:minor of ``/dev/null`` (1:3), so a
container that is given one can open it, write to it and issue ioctls on it
(which fail with ENOTTY).  Its device ID is ``GPU-<node>-<i>``; inside a
container it appears as ``/dev/nvidia<i>``.

The CDI spec ``<node dir>/cdi/nvidia.com-gpu.json`` (kind ``nvidia.com/gpu``)
names every card by its device ID, so ``nvidia.com/gpu=GPU-<node>-<i>``
resolves to its device node.

Topology, as NVIDIA's driver and the kernel lay it out, under the node directory (a DRA
driver's or device plugin's host root): ``proc/driver/nvidia/gpus/<bdf>/information`` with
the card's UUID and minor, ``sys/devices/pci<dom>:<bus>/.../<bdf>/numa_node`` and the link
``sys/bus/pci/devices/<bdf>``. Two cards per PCIe root complex and NUMA node: cards 0 and 1
under ``pci0000:00`` on NUMA node 0, cards 2 and 3 under ``pci0000:80`` on node 1, and so on.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

VENDOR_RESOURCE = "nvidia.com/gpu"
NULL_MAJOR = 1
NULL_MINOR = 3
CDI_VERSION = "0.5.0"
CARDS_PER_ROOT = 2


class CardError(Exception):
    """A fake card could not be created or named."""


@dataclass(frozen=True, slots=True)
class FakeCard:
    index: int
    device_id: str
    host_path: Path

    @property
    def container_path(self) -> str:
        return f"/dev/{device_name(self.index)}"

    @property
    def numa_node(self) -> int:
        return self.index // CARDS_PER_ROOT

    @property
    def pcie_root(self) -> str:
        return f"pci0000:{(self.numa_node * 0x80) % 0x100:02x}" if self.numa_node < 2 else \
            f"pci{self.numa_node:04x}:00"

    @property
    def pci_bus_id(self) -> str:
        domain = self.pcie_root[3:7]
        return f"{domain}:{0x3b + self.index:02x}:00.0"


def device_name(index: int) -> str:
    return f"nvidia{index}"


def card_device_id(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


def parse_card_index(device_id: str, node: str) -> int:
    """The card index of ``GPU-<node>-<i>``; :class:`CardError` for anything else."""
    prefix = f"GPU-{node}-"
    tail = device_id[len(prefix) :] if device_id.startswith(prefix) else ""
    if not tail.isdigit() or (len(tail) > 1 and tail.startswith("0")):
        raise CardError(f"device id {device_id!r} is not a card of node {node!r}")
    return int(tail)


def index_of_device_name(name: str) -> int | None:
    """``nvidia3`` -> 3; anything else -> None."""
    tail = name.removeprefix("nvidia")
    return int(tail) if tail != name and tail.isdigit() else None


def make_cards(node_dir: Path, node: str, count: int) -> list[FakeCard]:
    """Create (idempotently) the device nodes of ``count`` cards and the CDI spec."""
    dev_dir = node_dir / "dev"
    dev_dir.mkdir(parents=True, exist_ok=True)
    cards = [FakeCard(i, card_device_id(node, i), dev_dir / device_name(i)) for i in range(count)]
    for card in cards:
        _make_node(card.host_path)
        write_topology(node_dir, card)
    write_cdi_spec(node_dir / "cdi", cards)
    return cards


def write_topology(root: Path, card: FakeCard) -> None:
    """The card's NVIDIA information file and sysfs PCI device under ``root`` (idempotent)."""
    info = root / "proc" / "driver" / "nvidia" / "gpus" / card.pci_bus_id / "information"
    info.parent.mkdir(parents=True, exist_ok=True)
    info.write_text(f"Model: \t\t Fake GPU\nGPU UUID: \t {card.device_id}\nDevice Minor: \t {card.index}\n"
                    f"Bus Location: \t {card.pci_bus_id}\n")
    bridge = f"{card.pcie_root[3:]}:01.0"
    device = root / "sys" / "devices" / card.pcie_root / bridge / card.pci_bus_id
    device.mkdir(parents=True, exist_ok=True)
    (device / "numa_node").write_text(f"{card.numa_node}\n")
    link = root / "sys" / "bus" / "pci" / "devices" / card.pci_bus_id
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        os.symlink(os.path.relpath(device, link.parent), link)


def _make_node(path: Path) -> None:
    if path.exists() and stat.S_ISCHR(path.stat().st_mode):
        return
    path.unlink(missing_ok=True)
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NULL_MAJOR, NULL_MINOR))
        os.chmod(path, 0o666)
    except PermissionError:
        # Without root a plain file stands in; a process can still open it.
        path.touch(mode=0o666)
    except OSError as err:
        raise CardError(f"cannot create card device node {path}: {err}") from err


def cdi_spec(cards: list[FakeCard]) -> dict[str, object]:
    return {
        "cdiVersion": CDI_VERSION,
        "kind": VENDOR_RESOURCE,
        "devices": [
            {
                "name": card.device_id,
                "containerEdits": {
                    "deviceNodes": [
                        {
                            "path": card.container_path,
                            "hostPath": str(card.host_path),
                            "type": "c",
                            "major": NULL_MAJOR,
                            "minor": NULL_MINOR,
                            "permissions": "rw",
                        }
                    ]
                },
            }
            for card in cards
        ],
        "containerEdits": {},
    }


def write_cdi_spec(cdi_dir: Path, cards: list[FakeCard]) -> Path:
    cdi_dir.mkdir(parents=True, exist_ok=True)
    target = cdi_dir / "nvidia.com-gpu.json"
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(cdi_spec(cards), indent=2))
    tmp.replace(target)
    return target
