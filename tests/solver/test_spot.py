"""Table tests of the SpotGPU transitions (handlers called directly)."""

from __future__ import annotations

import pytest
from gpushare_common.events import LowPowerEvent, OwnerBackEvent, ReservedEvent, SpotEvent
from gpushare_common.mapping import IDLE_SPACE
from gpushare_solver.actions import Kmod, Reclaim, Release, SetHealth
from gpushare_solver.handlers import handle
from gpushare_solver.state import RESERVED, SPOT_OWNER, Evicted, HandlerError, SolverState

NODE = "n1"
OWNER = "dev/alice"


def reserved(pod: str = OWNER, *devices: str, state: str = "using") -> ReservedEvent:
    return ReservedEvent(node=NODE, pod=pod, container="main", vendor_resource="nvidia.com/gpu",
                        state=state, devices=devices or ("GPU-0",), lendable=True)  # type: ignore[arg-type]


def away(owner: str = OWNER, *devices: str) -> LowPowerEvent:
    return LowPowerEvent(node=NODE, owner=owner, using=False, devices=devices or ("GPU-0",))


def back(owner: str = OWNER) -> LowPowerEvent:
    return LowPowerEvent(node=NODE, owner=owner, using=True, devices=("GPU-0",))


def kernel_back(pod: str = OWNER, pidns: int = 4026532000) -> OwnerBackEvent:
    return OwnerBackEvent(node=NODE, pidns=pidns, pid=42, kernel_ts_ns=1, pod=pod, resolved=bool(pod))


def borrow(pod: str, *devices: str, state: str = "using") -> SpotEvent:
    return SpotEvent(node=NODE, pod=pod, container="main", state=state, devices=devices)  # type: ignore[arg-type]


def lent_state() -> SolverState:
    """alice holds GPU-0, went away; spot/b1 borrows spot-GPU-0."""
    state = SolverState()
    handle(reserved(), state)
    handle(away(), state)
    handle(borrow("spot/b1", "spot-GPU-0"), state)
    return state


def test_reserved_pod_makes_spot_devices_unhealthy() -> None:
    state = SolverState()
    actions = handle(reserved(OWNER, "GPU-0", "GPU-1"), state)
    assert actions == [SetHealth(resource="spot-gpu", reason=f"reserved by {OWNER}",
                                 devices={"spot-GPU-0": "Unhealthy", "spot-GPU-1": "Unhealthy"})]
    assert state.kind_of(OWNER) == RESERVED


def test_owner_away_lends_cards_healthy_and_detects() -> None:
    state = SolverState()
    handle(reserved(), state)
    actions = handle(away(), state)
    assert actions == [SetHealth(resource="spot-gpu", reason=f"owner {OWNER} away",
                                 devices={"spot-GPU-0": "Healthy"}),
                       Kmod(op="detect", pods=(OWNER,), reason="owner away")]
    assert state.kind_of(OWNER) == SPOT_OWNER
    assert state.cache.snapshot()[IDLE_SPACE] == {"spot-GPU-0": ""}
    assert handle(away(), state) == []  # still away: nothing new
    assert handle(reserved(), state) == []  # the detector re-announcing the holding changes nothing


def test_spot_pod_starts_uses_idle_space() -> None:
    state = lent_state()
    assert state.borrowers() == {"spot-GPU-0": "spot/b1"}
    assert handle(borrow("spot/b1", "spot-GPU-0"), state) == []


@pytest.mark.parametrize("trigger,release", [
    pytest.param(back(), Release(pods=(OWNER,)), id="lowpower-using"),
    pytest.param(kernel_back(), Release(pods=(OWNER,), pidns=(4026532000,)), id="kernel-ownerback"),
])
def test_owner_back_evicts_borrowers_withdraws_cards_and_releases(trigger: object, release: Release) -> None:
    state = lent_state()
    actions = handle(trigger, state)  # type: ignore[arg-type]
    assert actions == [
        SetHealth(resource="spot-gpu", reason=f"owner {OWNER} back", devices={"spot-GPU-0": "Unhealthy"}),
        Reclaim(reason="owner-back", pods=("spot/b1",), owner=OWNER, release=release, lent=("spot-GPU-0",)),
    ]
    assert state.borrowers() == {}
    assert IDLE_SPACE not in state.cache.snapshot()
    assert state.kind_of(OWNER) == RESERVED
    assert state.health["spot-GPU-0"] == "Unhealthy"


def test_an_owner_back_is_handled_once() -> None:
    """The kernel's owner-back reclaims and releases; the detector's echo of it (back, using=True)
    then changes nothing."""
    state = lent_state()
    first = handle(kernel_back(), state)
    assert next(a for a in first if isinstance(a, Reclaim)).pods == ("spot/b1",)
    assert handle(back(), state) == []


def test_owner_back_when_not_lending_still_releases() -> None:
    state = SolverState()
    handle(reserved(), state)
    assert handle(kernel_back(), state) == [  # its card was not lent: the kubelet is asked all the same
        Reclaim(reason="owner-back", owner=OWNER, release=Release(pods=(OWNER,), pidns=(4026532000,)),
                lent=("spot-GPU-0",))]


def test_unresolved_owner_back_reclaims_every_away_owner() -> None:
    state = lent_state()
    actions = handle(kernel_back(pod="", pidns=7), state)
    reclaims = [a for a in actions if isinstance(a, Reclaim)]
    assert reclaims[0].pods == ("spot/b1",) and reclaims[0].owner == OWNER
    assert reclaims[-1] == Reclaim(reason="owner-back", release=Release(pidns=(7,)))


def test_reserved_pod_taking_a_lent_card_evicts_its_borrowers() -> None:
    state = SolverState()
    handle(reserved("dev/bob", "GPU-1", state="cleared"), state)
    handle(borrow("spot/b2", "spot-GPU-1"), state)
    actions = handle(reserved("infer/big", "GPU-1"), state)
    assert actions == [
        SetHealth(resource="spot-gpu", reason="reserved by infer/big", devices={"spot-GPU-1": "Unhealthy"}),
        Reclaim(reason="reserved", pods=("spot/b2",), owner="infer/big", lent=("spot-GPU-1",)),
    ]
    assert state.borrowers() == {}


def test_spot_pod_on_a_reserved_card_is_evicted() -> None:
    state = SolverState()
    handle(reserved(), state)
    assert handle(borrow("spot/late", "spot-GPU-0"), state) == [
        Reclaim(reason="reserved", pods=("spot/late",), owner=OWNER)]
    assert state.borrowers() == {}


def test_reserved_cleared_makes_cards_borrowable() -> None:
    state = SolverState()
    handle(reserved(), state)
    actions = handle(reserved(state="cleared"), state)
    assert actions == [SetHealth(resource="spot-gpu", reason=f"released by {OWNER}",
                                 devices={"spot-GPU-0": "Healthy"})]
    assert state.cache.snapshot() == {IDLE_SPACE: {"spot-GPU-0": ""}}
    assert handle(reserved(state="cleared"), state) == []


def test_spot_cleared_frees_the_device() -> None:
    state = lent_state()
    assert handle(borrow("spot/b1", "spot-GPU-0", state="cleared"), state) == []
    assert state.borrowers() == {}
    handle(borrow("spot/b1", "spot-GPU-0"), state)
    handle(borrow("spot/b1", state="cleared"), state)
    assert state.borrowers() == {}


@pytest.mark.parametrize("event", [
    pytest.param(borrow("spot/x", "GPU-0"), id="spot-id-without-prefix"),
    pytest.param(LowPowerEvent(node=NODE, owner="dev/nobody", using=False), id="away-without-devices"),
])
def test_bad_events_are_typed_errors(event: object) -> None:
    with pytest.raises(HandlerError):
        handle(event, SolverState())  # type: ignore[arg-type]


def test_a_spot_device_borrowed_twice_is_a_typed_error() -> None:
    state = lent_state()
    with pytest.raises(HandlerError, match="already used"):
        handle(borrow("spot/b9", "spot-GPU-0"), state)


def test_a_spot_event_of_a_pod_evicted_already_is_not_a_new_borrower() -> None:
    """A borrower found through the kubelet at an owner-back is evicted before its SpotEvent
    comes; that event, arriving afterwards, neither lends nor evicts again."""
    state = SolverState()
    handle(reserved(), state)
    state.evicted.add("spot/late", "uid-1")
    late = SpotEvent(node="n1", pod="spot/late", container="c0", state="using", devices=("spot-GPU-0",),
                     pod_uid="uid-1")
    assert handle(late, state) == [] and state.borrowers() == {}
    again = SpotEvent(node="n1", pod="spot/late", container="c0", state="using", devices=("spot-GPU-0",),
                      pod_uid="uid-2")  # another pod of that name: news
    assert handle(again, state) == [Reclaim(reason="reserved", pods=("spot/late",), owner=OWNER)]


def test_evicted_matches_by_uid_or_for_a_while_by_name_and_is_bounded() -> None:
    now = [1000.0]
    evicted = Evicted(keep=2, unnamed_s=60, clock=lambda: now[0])
    evicted.add("a/one", "u1")
    evicted.add("a/two", "")
    assert evicted.has("a/one", "u1") and not evicted.has("a/one", "u9") and evicted.has("a/one")
    assert evicted.has("a/two", "any") and not evicted.has("a/three")
    now[0] += 61
    assert not evicted.has("a/two", "any") and evicted.has("a/one", "u1")
    evicted.add("a/three", "u3")
    assert not evicted.has("a/one", "u1") and evicted.has("a/three", "u3")  # the oldest went
