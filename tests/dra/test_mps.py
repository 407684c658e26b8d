"""The MPS control daemon of a DRA node (NVIDIA's MPS profile, the sim's stand-in for its
daemon): up before the first capped share's container starts, supervised while shares run,
stopped after the last; each share's container carries its caps (pinned memory = card memory
x k / N, active threads = 100 k / N, the node's MPS pipe)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from gpushare_common import dra
from gpushare_common.settings import NatsSettings
from gpushare_sim.node.testing import wait_until

from tests.dra.harness import DraNode, dra_node
from tests.support.kubeapi import (
    KubeApi,
    kube_api,  # noqa: F401  (the fixture)
)


def share(shares: int) -> dict[str, object]:
    return {"deviceClassName": dra.SHARE_CLASS, "capacity": {"requests": {dra.SHARES: str(shares)}}}


def checks_daemon(node: DraNode) -> list[str]:
    """The container: exit 3 unless the daemon's control socket is there when it starts."""
    return ["sh", "-c", f"test -S {node.driver.mps.control} || exit 3; exec sleep 3600"]


def log_lines(node: DraNode) -> list[str]:
    path = Path(node.driver.mps.directory) / "log" / "control.log"
    return [line.split()[-1] for line in path.read_text().splitlines()] if path.exists() else []


async def test_the_daemon_runs_exactly_while_capped_shares_do(kube_api: KubeApi,  # noqa: F811
                                                              nats_settings: NatsSettings) -> None:
    async with dra_node(kube_api, nats_settings, gpus=1) as node:
        await wait_until(node.slice_devices, 15, "the node's slice")
        await node.classes()
        await node.template("quarter", share(25))
        await node.template("half", share(50))
        assert not node.driver.mps.answers() and log_lines(node) == []
        await node.pod("quarter", "quarter", checks_daemon(node))
        await node.pod("half", "half", checks_daemon(node))
        await node.running("quarter")
        await node.running("half")
        memory = int(node.driver.settings.card_memory_mib["nvidia.com/gpu"])
        for name, k in (("quarter", 25), ("half", 50)):  # the CDI edits the runtime applies (no runtime here)
            (spec,) = [c.spec for c in node.driver.preparer.state.claims.values() if c.name.startswith(f"{name}-")]
            edits = spec["devices"][0]["containerEdits"]  # type: ignore[index]
            assert {f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={memory * k // 100}M",
                    f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={k}"} <= set(edits["env"])
            assert {m["hostPath"] for m in edits["mounts"]} == {f"{node.driver.mps.directory}/{d}"
                                                                 for d in ("pipe", "log", "shm")}
        status = node.driver.status()["mps_daemon"]
        assert status["answers"] and status["pid"] and status["starts"] == 1 and log_lines(node) == ["started"]

        os.killpg(status["pid"], signal.SIGKILL)  # it dies while shares run: started again
        await wait_until(lambda: node.driver.mps.starts == 2 and node.driver.mps.answers(), 15, "the daemon again")

        await node.kube.delete_pod("default", "quarter")
        await wait_until(lambda: _phase_gone(node, "quarter"), 30, "the quarter gone")
        assert node.driver.mps.answers(), "one capped share left: the daemon stays"
        await node.kube.delete_pod("default", "half")
        await wait_until(lambda: _phase_gone(node, "half"), 30, "the half gone")
        await wait_until(lambda: not node.driver.mps.answers(), 10, "the daemon stopped after the last share")
        assert log_lines(node)[-1] == "quit" and node.driver.status()["mps_daemon"]["pid"] is None


async def _phase_gone(node: DraNode, name: str) -> bool:
    return await node.phase(name) == "gone" and not any(
        c.name.startswith(f"{name}-") for c in node.driver.preparer.state.claims.values())
