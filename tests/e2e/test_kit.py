"""The scenario kit's parsers, the narration and the event-stream follower, without a cluster."""

from __future__ import annotations

import asyncio
import time
import types
from typing import Any, cast

from gpushare_common.subjects import Subjects
from gpushare_sim.run.narrate import Timeline
from gpushare_sim.scenarios.badinput import _reason, failure_text
from gpushare_sim.scenarios.kit import Scenario, gpu_devices, recording
from hypothesis import given
from hypothesis import strategies as st

LS = """total 0
crw-rw-rw-    1 root     root        1,   3 Nov 29 23:52 null
crw-rw-rw-    1 root     root      195,   2 Nov 29 23:52 nvidia2
crw-rw-rw-    1 root     root      195, 255 Nov 29 23:52 nvidiactl
drwxr-xr-x    2 root     root           40 Nov 29 23:52 pts
-rw-r--r--    1 root     root            0 Nov 29 23:52 nvidia-notes
"""


def test_gpu_devices_lists_only_gpu_character_devices() -> None:
    assert gpu_devices(LS) == ["nvidia2=195,2"]
    assert gpu_devices("c nvidia0\ncrw , nvidia1") == []


@given(st.text())
def test_gpu_devices_never_raises_on_arbitrary_text(text: str) -> None:
    for item in gpu_devices(text):
        assert item.startswith("nvidia") and "=" in item


@given(st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 1 << 20), st.integers(0, 64)), max_size=8))
def test_gpu_devices_round_trips_major_minor(cards: list[tuple[int, int, int]]) -> None:
    lines = [f"crw-rw-rw-    1 root root {major}, {minor} Nov 29 23:52 nvidia{index}"
             for major, minor, index in cards]  # fmt: skip
    expected = sorted(f"nvidia{index}={major},{minor}" for major, minor, index in cards)
    assert gpu_devices("\n".join(lines)) == expected


def test_failure_text_reads_the_start_error_of_a_container() -> None:
    message = ("failed to start: ctr: failed to create shim task: OCI runtime create failed: create abc: "
               "annotation gpushare.k8s.io/container-devices-from.main, source a/b/main: reference leaves "
               "the pod and gpushare.k8s.io/signature.main is missing: unknown")  # fmt: skip
    pod = {"status": {"phase": "Failed", "containerStatuses": [
        {"state": {"terminated": {"exitCode": 128, "reason": "StartError", "message": message}}}]}}
    text = failure_text(pod)
    assert "StartError" in text and "signature.main is missing" in text
    assert _reason(message).startswith("annotation gpushare.k8s.io/container-devices-from.main")
    assert not _reason(message).endswith("unknown")
    assert failure_text(None) == "" and failure_text({"status": {"phase": "Running"}}) == ""


def test_timeline_summary_lists_outcomes_and_hops() -> None:
    timeline = Timeline(out=None)
    timeline.hop("spot", "owner ioctl -> owner's call returns", 0.0125)
    timeline.result("spot", True, 6.1, "borrower evicted")
    timeline.result("dind", False, 1.0, "TimeoutError: x")
    timeline.result("faults", True, 0.0, "needs real containers", skipped=True)
    summary = timeline.summary()
    assert "owner ioctl -> owner's call returns" in summary and "12.5 ms" in summary
    assert "skipped" in summary and "SKIPPED" in timeline.lines[-1]
    assert "FAILED" in summary and timeline.hops_of("spot") == {"owner ioctl -> owner's call returns": 0.0125}


class _LosingBus:
    """Reads that lose a cancellation, as a read through asyncio.wait_for on Python 3.11 does when
    its reply came in the same turn as the cancel."""

    subjects = Subjects()

    def __init__(self) -> None:
        self.reads = 0

    async def last_seq(self) -> int:
        return 0

    async def drain(self) -> None:
        pass

    async def read_after(self, subject: str, after_seq: int, limit: int = 1000) -> list[Any]:
        self.reads += 1
        try:
            await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            pass
        return []


class _EmptyKube:
    async def list_pods(self, namespace: str, label_selector: str = "") -> tuple[list[Any], str]:
        return [], "1"


class _OneNode:
    """A cluster of one node, whose leaf is the scenario's bus (set in ``Scenario.leaves``)."""

    nodes = [types.SimpleNamespace(name="gpu-node-1")]


async def test_recording_stops_its_follower_even_when_a_read_loses_the_cancellation() -> None:
    bus = _LosingBus()
    s = Scenario("kit", cast(Any, _OneNode()), Timeline(out=None), cast(Any, _EmptyKube()), cast(Any, bus))
    s.leaves["gpu-node-1"] = cast(Any, bus)  # the node's leaf, "connected" already
    started = time.monotonic()
    async with recording(s):
        while bus.reads < 2:  # the follower is inside a read when the recording ends
            await asyncio.sleep(0.01)
    assert time.monotonic() - started < 5
    reads = bus.reads
    await asyncio.sleep(0.5)
    assert bus.reads == reads, "the follower reads on after the recording ended"
