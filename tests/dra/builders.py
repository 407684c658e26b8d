"""Cards, claims and node trees in the shapes the driver meets them."""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path
from typing import Any

from gpushare_common import dra
from gpushare_common.topology import CardTopology
from gpushare_dra_driver.cards import Card
from gpushare_sim.fakegpu.cards import FakeCard, write_topology

Obj = dict[str, Any]
NODE = "gpu-node-9"
GPU = "nvidia.com/gpu"


def card(index: int, healthy: bool = True, root: str = "pci0000:00", numa: int | None = 0,
         memory: int | None = 16384) -> Card:
    return Card(f"GPU-{NODE}-{index}", GPU, index, healthy,
                CardTopology(f"0000:{0x3b + index:02x}:00.0", numa, root), memory, "Fake A100")


def devices(cards: list[Card]) -> dict[str, tuple[Card, bool]]:
    found: dict[str, tuple[Card, bool]] = {}
    for item in cards:
        found[item.name] = (item, False)
        found[item.spot_name] = (item, True)
    return found


def claim(name: str = "c1", results: list[Obj] | None = None, requests: list[Obj] | None = None,
          namespace: str = "ml", uid: str = "") -> Obj:
    """A ResourceClaim allocated to ``results`` (None: not allocated)."""
    body: Obj = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
        "spec": {"devices": {"requests": requests or [
            {"name": "gpu", "exactly": {"deviceClassName": dra.SHARE_CLASS,
                                        "capacity": {"requests": {dra.SHARES: "25"}}}}]}},
    }
    if results is not None:
        body["status"] = {"allocation": {"devices": {"results": results}}}
    return body


def result(device: str, shares: str | None = "25", request: str = "gpu", pool: str = NODE,
           driver: str = dra.DRIVER) -> Obj:
    doc: Obj = {"request": request, "driver": driver, "pool": pool, "device": device}
    if shares is not None:
        doc["consumedCapacity"] = {dra.SHARES: shares}
    return doc


def fake_host(root: Path, cards: int = 4) -> Path:
    """A host tree as NVIDIA's driver and the kernel lay it out (the sim's fake cards'), with
    /dev/nvidia<i> and /dev/nvidiactl."""
    for index in range(cards):
        write_topology(root, FakeCard(index, f"GPU-{NODE}-{index}", root / "dev" / f"nvidia{index}"))
        device_node(root / "dev" / f"nvidia{index}")
    device_node(root / "dev" / "nvidiactl")
    return root


def device_node(path: Path) -> Path:
    """A character device with /dev/null's numbers (a plain file without root)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            path.touch()
    return path
