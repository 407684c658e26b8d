"""The real-GPU check's DRA step: capped shares prepared by the DRA driver's own code.

- the driver's :class:`~gpushare_dra_driver.prepare.Preparer` prepares two claims of 25 of 100
  shares of the card (their CDI specs in the runtime's ``cdi_dirs``: device node, visible
  devices, the MPS caps and the node's MPS directories);
- the driver's :class:`~gpushare_dra_driver.mps.MpsDaemon` starts the node's MPS control daemon
  (the driver's command, in a private mount namespace whose ``/dev/shm`` is the MPS directory's
  ``shm``, as the chart mounts it into the driver's pod) and answers only once it does;
- two runc containers through gpushare-runtime get a claim each through a signed
  ``container-devices-ids`` annotation naming its CDI device (as the kubelet's CDI devices reach
  the runtime): one holds memory under its cap while the other allocating past it is refused;
- unpreparing both stops the daemon.

The stand-in card rehearsal (tests/gpu/test_run_sh.py) runs the same plumbing with the sim's
stand-in daemon.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from gpushare_common import dra, ids
from gpushare_common.vendors import load_vendor_table
from gpushare_dra_driver.adapters.files import NodeFiles
from gpushare_dra_driver.cards import Card
from gpushare_dra_driver.claims import ClaimRef
from gpushare_dra_driver.mps import MpsDaemon
from gpushare_dra_driver.prepare import Node as DriverNode
from gpushare_dra_driver.prepare import Preparer
from gpushare_dra_driver.settings import MPS_COMMAND
from gpushare_dra_driver.state import PreparedClaim, PreparedState

SHARES, K = 100, 25
# the driver's daemon with the chart's /dev/shm: the MPS directory's shm, in a mount namespace of its own
PRIVATE_SHM = ("exec unshare --mount --propagation private sh -c "
               "'mount --bind \"$CUDA_MPS_PIPE_DIRECTORY/../shm\" /dev/shm && exec sh -c \"$GPUSHARE_CHECK_MPS\"'")


class Claims:
    """Claims allocated on the card, as the API would return them."""

    def __init__(self, pool: str, device: str) -> None:
        self.pool, self.device, self.bodies = pool, device, {}  # type: ignore[var-annotated]

    def add(self, name: str) -> ClaimRef:
        uid = str(uuid.uuid4())
        self.bodies[name] = {
            "metadata": {"name": name, "namespace": "team", "uid": uid},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": dra.SHARE_CLASS, "capacity": {"requests": {dra.SHARES: str(K)}}}}]}},
            "status": {"allocation": {"devices": {"results": [{
                "request": "gpu", "driver": dra.DRIVER, "pool": self.pool, "device": self.device,
                "consumedCapacity": {dra.SHARES: str(K)}}]}}}}
        return ClaimRef("team", name, uid)

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(self.bodies[name])


def preparer(work: Path, card: Card, node: str) -> tuple[Preparer, Claims, str]:
    """The driver's Preparer for one card, its claims, and the node's MPS directory."""
    mps_dir = str(work / "isolation" / "dra")
    vendors = load_vendor_table(str(work / "runtime.json"))
    info = DriverNode(dra.DRIVER, node, SHARES, vendors, "", "/", mps_dir, lambda: {card.name: (card, False)})
    files = NodeFiles(str(work / "cdi"), str(work / "dra-prepared.json"))
    return Preparer(info, None, files, PreparedState()), Claims(node, card.name), mps_dir  # type: ignore[arg-type]


def devices_annotation(sign: Any, prepared: PreparedClaim) -> dict[str, str]:
    """The signed annotation naming the claim's CDI devices (what the kubelet hands the runtime)."""
    names = [cdi.split("=", 1)[1] for device in prepared.devices for cdi in device.cdi_ids]
    return dict(sign(ids.KIND_IDS, ids.format_devices_ids({dra.CDI_KIND: names})))


async def prepare_two(work: Path, card: Card, node: str, daemon_command: str) -> tuple[Any, ...]:
    """Two claims of K shares prepared, the daemon up: (preparer, refs, claims, daemon)."""
    shares, claims, mps_dir = preparer(work, card, node)
    shares.claims = claims
    refs = [claims.add("dra-a"), claims.add("dra-b")]
    prepared = await shares.prepare(refs)
    daemon = MpsDaemon(node, mps_dir, daemon_command, ready_s=30)
    await daemon.ensure(True)
    return shares, refs, prepared, daemon


async def release(shares: Preparer, refs: list[ClaimRef], daemon: MpsDaemon) -> bool:
    """Unprepare both and stop the daemon, as the driver does after the last; whether it stopped."""
    await shares.unprepare(refs)
    await daemon.ensure(False)
    return not daemon.answers()


def mps_environment() -> dict[str, str]:
    """What the wrapped daemon command reads (the driver's own command)."""
    return {"GPUSHARE_CHECK_MPS": MPS_COMMAND}
