"""The fake cards' entry in the node's vendor table (the gpushare runtime's runtime.json).

It is the runtime's built-in ``nvidia.com/gpu`` entry (the same visible-devices variable and
device nodes) with an isolation profile of its own in place of NVIDIA's MPS, which needs the
driver these cards do not have: each capped share receives environment variables computed
from N (shares per card), k (the shares it holds), the card's memory and its compute share,
so a scenario can read the caps inside every SharePod's container.
"""

from __future__ import annotations

import sys
from typing import Any

from gpushare_sim.fakegpu.cards import VENDOR_RESOURCE

PROFILE = "sim_caps"
# what a DRA node's driver runs as the MPS control daemon of this profile's shares
MPS_STAND_IN = f"exec {sys.executable} -m gpushare_sim.fakegpu.mpsd"
MEMORY_ENV = "GPUSHARE_SIM_MEMORY_LIMIT_MIB"
PERCENT_ENV = "GPUSHARE_SIM_COMPUTE_PERCENT"
SHARES_ENV = "GPUSHARE_SIM_SHARES"
ISOLATION: dict[str, Any] = {
    "name": PROFILE,
    "env": {MEMORY_ENV: "{card_memory_mib * k / n}", PERCENT_ENV: "{percent}", SHARES_ENV: "{k}/{n}"},
}


def vendor_table() -> dict[str, dict[str, Any]]:
    """``vendors`` of the node's runtime.json."""
    return {VENDOR_RESOURCE: {
        "env": ["NVIDIA_VISIBLE_DEVICES"],
        "device_nodes": ["/dev/nvidia{id}", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                         "/dev/nvidia-modeset"],
        "isolation": ISOLATION,
    }}  # fmt: skip


def expected_caps(card_memory_mib: int, n: int, k: int, percent: int | None = None) -> dict[str, str]:
    """What a share of k of N receives (``percent``: the pod's own lower compute share)."""
    return {MEMORY_ENV: str(card_memory_mib * k // n), PERCENT_ENV: str(percent or max(100 * k // n, 1)),
            SHARES_ENV: f"{k}/{n}"}
