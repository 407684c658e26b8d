"""Where a card sits on the node: its PCI address, NUMA node and PCIe root complex, from sysfs.

The vendor table's ``topology`` entry (:mod:`gpushare_common.vendors`) says how a device ID
becomes a PCI address; the rest is the kernel's: ``/sys/bus/pci/devices/<address>/numa_node``
(``-1``: no NUMA affinity) and the device's canonical path under ``/sys/devices``, whose
first component ``pci<domain>:<bus>`` is its PCIe root complex, the value Kubernetes'
standard DRA attribute ``resource.kubernetes.io/pcieRoot`` takes.

``root`` prefixes every path (a container that mounts the host's ``/sys`` and ``/proc`` under
``/host``, or a simulated node's directory). Standard library only; unreadable or missing
files mean "unknown", never an error: topology is a preference, not a requirement.
"""

from __future__ import annotations

import glob as globbing
import os
from dataclasses import dataclass

from .vendors import ID_PLACEHOLDER, VendorResource

PCI_DEVICES = "/sys/bus/pci/devices"
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class CardTopology:
    pci_bus_id: str = ""
    numa_node: int | None = None
    pcie_root: str = ""


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def is_pci_bus_id(value: str) -> bool:
    """``dddd:bb:dd.f`` in lower-case hexadecimal (extended BDF notation)."""
    parts = value.split(":")
    if len(parts) != 3 or len(parts[0]) != 4 or len(parts[1]) != 2:
        return False
    slot, dot, function = parts[2].partition(".")
    digits = parts[0] + parts[1] + slot + function
    return bool(dot) and len(slot) == 2 and len(function) == 1 and all(c in _HEX for c in digits)


def pci_bus_id(vendor: VendorResource, card: str, root: str = "") -> str:
    """The card's PCI address as the vendor table finds it; "" when unknown."""
    source = vendor.topology.get("pci_bus_id")
    if isinstance(source, str):
        found = source.replace(ID_PLACEHOLDER, card).lower()
        return found if is_pci_bus_id(found) else ""
    if not isinstance(source, dict):
        return ""
    wanted = " ".join(str(source["line"]).replace(ID_PLACEHOLDER, card).split())
    head, _, tail = str(source["glob"]).partition("*")
    for path in sorted(globbing.glob(root + source["glob"])):
        text = _read(path)
        if text is not None and any(" ".join(line.split()) == wanted for line in text.splitlines()):
            address = path[len(root + head):len(path) - len(tail)].lower()
            return address if is_pci_bus_id(address) else ""
    return ""


def pcie_root(address: str, root: str = "") -> str:
    """``pci<domain>:<bus>`` of the root complex above the device; "" when unknown."""
    real = os.path.realpath(f"{root}{PCI_DEVICES}/{address}")
    for part in real[len(os.path.realpath(root or "/")):].split("/"):
        name = part.removeprefix("pci")
        if part.startswith("pci") and len(name) == 7 and name[4] == ":" and \
                all(c in _HEX for c in name[:4] + name[5:]):
            return part
    return ""


def numa_node(address: str, root: str = "") -> int | None:
    text = (_read(f"{root}{PCI_DEVICES}/{address}/numa_node") or "").strip()
    try:
        node = int(text)
    except ValueError:
        return None
    return node if node >= 0 else None


def card_topology(vendor: VendorResource, card: str, root: str = "") -> CardTopology:
    address = pci_bus_id(vendor, card, root)
    if not address:
        return CardTopology()
    return CardTopology(address, numa_node(address, root), pcie_root(address, root))
