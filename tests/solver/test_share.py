"""Table tests of the ShareGPU transitions (handlers called directly)."""

from __future__ import annotations

import pytest
from gpushare_common.events import ShadowEvent, ShareEvent
from gpushare_solver.actions import DeviceList, OwnerAnnotation, Reclaim, UsingCondition
from gpushare_solver.handlers import handle
from gpushare_solver.state import HandlerError, SolverState

NODE = "n1"
SHADOW = "team/shadow-a"
DEV = ["team/shadow-a-0", "team/shadow-a-1"]


def running(shadow: str = SHADOW, spec: int = 2, terminating: bool = False) -> ShadowEvent:
    return ShadowEvent(node=NODE, shadow_pod=shadow, state="running", resource="share-gpu-2",
                       share_spec=spec, devices=("GPU-0",), terminating=terminating)


def using(pod: str, *devices: str) -> ShareEvent:
    return ShareEvent(node=NODE, share_pod=pod, container="main", resource="share-gpu-2",
                      state="using", devices=devices)


def cleared(pod: str, *devices: str) -> ShareEvent:
    return ShareEvent(node=NODE, share_pod=pod, container="main", resource="share-gpu-2",
                      state="cleared", devices=devices)


def shadow_cleared(shadow: str = SHADOW) -> ShadowEvent:
    return ShadowEvent(node=NODE, shadow_pod=shadow, state="cleared", resource="share-gpu-2")


def test_shadow_running_creates_virtual_devices_and_lists_them() -> None:
    state = SolverState()
    actions = handle(running(), state)
    assert state.cache.snapshot() == {SHADOW: dict.fromkeys(DEV, "")}
    assert actions == [DeviceList(resource="share-gpu-2", devices=tuple(DEV),
                                  reason=f"shadow {SHADOW} running")]
    assert handle(running(), state) == []  # the same news again changes nothing


def test_share_using_uses_sets_condition_and_annotation() -> None:
    state = SolverState()
    handle(running(), state)
    actions = handle(using("apps/infer-1", DEV[1]), state)
    assert state.cache.users_of(SHADOW) == {"apps/infer-1"}
    assert actions == [UsingCondition(shadow_pod=SHADOW, users={DEV[1]: "apps/infer-1"}),
                       OwnerAnnotation(share_pod="apps/infer-1", shadow_pod=SHADOW)]
    assert handle(using("apps/infer-1", DEV[1]), state) == []


@pytest.mark.parametrize("setup", [
    pytest.param([], id="shadow-unknown"),
    pytest.param([running(terminating=True)], id="shadow-terminating"),
    pytest.param([running(), shadow_cleared()], id="shadow-cleared"),
])
def test_share_using_a_gone_or_terminating_shadow_evicts_the_sharepod(setup: list[ShadowEvent]) -> None:
    state = SolverState()
    for event in setup:
        handle(event, state)
    actions = handle(using("apps/infer-1", DEV[0]), state)
    assert [a for a in actions if isinstance(a, Reclaim)] == [
        Reclaim(reason="shadow-gone", pods=("apps/infer-1",), owner=state.cache.owner_of(DEV[0]) or "")]
    assert "apps/infer-1" not in str(state.cache.snapshot())


def test_share_cleared_unuses_and_clears_the_condition() -> None:
    state = SolverState()
    handle(running(), state)
    handle(using("apps/infer-1", DEV[0]), state)
    actions = handle(cleared("apps/infer-1", DEV[0]), state)
    assert state.cache.users_of(SHADOW) == set()
    assert actions == [UsingCondition(shadow_pod=SHADOW, users={})]
    assert handle(cleared("apps/infer-1", DEV[0]), state) == []


def test_share_cleared_without_devices_frees_everything_the_pod_held() -> None:
    state = SolverState()
    handle(running(), state)
    handle(using("apps/infer-1", *DEV), state)
    assert handle(cleared("apps/infer-1"), state) == [UsingCondition(shadow_pod=SHADOW, users={})]


def test_shadow_cleared_evicts_users_drops_owner_refreshes_devices() -> None:
    state = SolverState()
    handle(running(), state)
    handle(running("team/shadow-b"), state)
    handle(using("apps/infer-1", DEV[0]), state)
    handle(using("apps/infer-2", DEV[1]), state)
    actions = handle(shadow_cleared(), state)
    assert SHADOW not in state.cache.snapshot()
    assert actions == [
        Reclaim(reason="shadow-gone", pods=("apps/infer-1", "apps/infer-2"), owner=SHADOW),
        DeviceList(resource="share-gpu-2", devices=("team/shadow-b-0", "team/shadow-b-1"),
                   reason=f"shadow {SHADOW} cleared"),
    ]
    assert handle(shadow_cleared(), state) == []


def test_a_device_used_by_another_pod_is_a_typed_error() -> None:
    state = SolverState()
    handle(running(), state)
    handle(using("apps/infer-1", DEV[0]), state)
    with pytest.raises(HandlerError, match="already used by apps/infer-1"):
        handle(using("apps/infer-2", DEV[0]), state)


def test_a_malformed_shadow_key_is_a_typed_error() -> None:
    with pytest.raises(HandlerError):
        handle(running("no-namespace"), SolverState())
