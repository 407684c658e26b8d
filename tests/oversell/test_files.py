"""The scenario's node files as the detector reads them, and its figures through the services' own rules."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from gpushare_common.pods import PodRules, read_pod
from gpushare_detector.adapters.cgroups import read_node, read_pods
from gpushare_detector.capacity import Policy
from gpushare_detector.capacity_service import Snapshot, compute
from gpushare_sim.scenarios import oversell as ov
from gpushare_solver.pressure import NodeUsage, OversoldPod, PressurePolicy, choose_victims, oversold_pod
from hypothesis import given, settings
from hypothesis import strategies as st

PAGE = 4096  # memory.current counts pages
UIDS = [str(uuid.UUID(int=i + 1)) for i in range(8)]


def pod(uid: str) -> dict[str, Any]:
    return {"metadata": {"uid": uid}}


def snapshot(files: ov.NodeFiles, at: float) -> Snapshot:
    return Snapshot(at, read_node(files.proc), read_pods(files.cgroup))


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.sampled_from(UIDS), st.integers(0, ov.GIB // PAGE).map(lambda n: n * PAGE), max_size=6))
def test_what_the_scenario_writes_the_detector_reads(pods: dict[str, int]) -> None:
    with tempfile.TemporaryDirectory() as root:
        files = ov.NodeFiles(Path(root))
        for uid, memory in pods.items():
            files.set_pod(pod(uid), memory)
        files.write()
        read = read_pods(files.cgroup)
        assert read.version == 2 and read.errors == {}
        assert {uid: u.memory for uid, u in read.pods.items()} == pods
        node = read_node(files.proc)
        assert (node.cpus, node.memory_total, node.memory_used) == (8, ov.MEMORY_TOTAL, files.memory_used)
        for uid in list(pods)[:2]:
            files.remove_pod(pod(uid))
        files.write()
        assert set(read_pods(files.cgroup).pods) == set(pods) - set(list(pods)[:2])


def test_scenario_figures_under_the_detector_and_solver_rules(tmp_path: Path) -> None:
    files = ov.NodeFiles(tmp_path)
    trainer, tasks = UIDS[0], dict(zip(("data-1", "data-2", "data-3"), UIDS[1:4], strict=True))
    files.set_pod(pod(trainer), ov.TRAINER_MEMORY)
    for uid in tasks.values():
        files.set_pod(pod(uid), ov.STARTED)
    files.write()
    first = snapshot(files, 0.0)
    spare = compute(first, snapshot(files, 1.0), set(tasks.values()), Policy())["vmem"]
    assert spare.devices == ov.spare_devices(ov.TRAINER_MEMORY) == 18
    assert files.memory_used / ov.MEMORY_TOTAL < ov.THRESHOLD
    for uid in tasks.values():
        files.set_pod(pod(uid), ov.GROWN)
    files.write()
    grown = compute(first, snapshot(files, 2.0), set(tasks.values()), Policy())["vmem"]
    assert grown.devices == 18 and grown.inputs["node_memory_used"] / ov.MEMORY_TOTAL == pytest.approx(0.8, abs=1e-3)
    victims = choose_victims(NodeUsage.from_inputs(grown.inputs), oversold_tasks(), PressurePolicy(),
                             {"vmem": ov.VMEM_UNIT}, None, 0.0)
    assert victims == [f"oversell/{name}" for name in ov.EXPECTED_EVICTED]


def oversold_tasks() -> list[OversoldPod]:
    found = []
    for second, (name, priority) in enumerate(ov.DATA_TASKS):
        body = ov.data_task(name, priority)
        body["metadata"].update(namespace="oversell", creationTimestamp=f"2026-01-01T00:00:0{second}Z")
        task = oversold_pod(read_pod(body, PodRules()))
        assert task is not None
        found.append(task)
    return found
