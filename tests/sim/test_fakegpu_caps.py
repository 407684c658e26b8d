"""The fake cards' vendor table: the runtime's own entry with an isolation profile it computes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gpushare_common import isolation
from gpushare_runtime.config import DEFAULT_VENDORS, parse_config
from gpushare_sim.fakegpu import vendor
from gpushare_sim.fakegpu.cards import VENDOR_RESOURCE
from gpushare_sim.node.adapters.backend import runtime_config
from gpushare_sim.node.settings import NodeSimSettings


def test_the_entry_is_the_runtimes_own_but_for_its_isolation() -> None:
    entry = vendor.vendor_table()[VENDOR_RESOURCE]
    builtin = DEFAULT_VENDORS[VENDOR_RESOURCE]
    assert (tuple(entry["env"]), tuple(entry["device_nodes"])) == (builtin.env, builtin.device_nodes)
    assert entry["isolation"]["name"] == vendor.PROFILE != isolation.MPS


@pytest.mark.parametrize(("memory", "n", "k", "percent"), [
    (16384, 3, 1, None), (16384, 3, 1, 20), (16384, 4, 2, None), (16384, 4, 1, None), (81920, 16, 16, None),
    (1000, 3, 2, 7),
])  # fmt: skip
def test_the_runtime_computes_what_the_scenario_expects(tmp_path: Path, memory: int, n: int, k: int,
                                                        percent: int | None) -> None:
    settings = NodeSimSettings(name="gpu-node-1", sim_dir=tmp_path)
    settings.node_dir.mkdir(parents=True)
    path = runtime_config(settings)
    config = parse_config(str(path), path.read_text())
    profile = config.isolation_of(VENDOR_RESOURCE)
    caps = isolation.ShareCaps(vendor.PROFILE, VENDOR_RESOURCE, "gpushare-system/sh-1", n, k, memory)
    share = isolation.compute_percent(caps, None if percent is None else str(percent), "compute-percentage")
    computed = isolation.compute(profile, isolation.share_values(caps, config.isolation_dir, share), "caps")
    assert computed.env == vendor.expected_caps(memory, n, k, percent)
    assert computed.mounts == [] and json.loads(path.read_text())["node_name"] == "gpu-node-1"
