"""Table tests of the free-card transitions (see docs/state-machines.md, 'Solver card states'):
the card inventory lends cards no pod holds; a card taken or gone is withdrawn."""

from __future__ import annotations

import pytest
from gpushare_common.events import CardInventory, LowPowerEvent, ReservedEvent, ShadowEvent, SpotEvent
from gpushare_common.mapping import IDLE_SPACE
from gpushare_solver.actions import DeviceList, Reclaim, SetHealth
from gpushare_solver.handlers import handle
from gpushare_solver.reconcile import reconcile
from gpushare_solver.state import HandlerError, SolverState

NODE = "n1"
VENDOR = "nvidia.com/gpu"
SHADOW = "team/shadow-a"


def inventory(*cards: str) -> CardInventory:
    return CardInventory(node=NODE, vendor_resource=VENDOR, devices=cards)


def reserved(pod: str, *cards: str, state: str = "using") -> ReservedEvent:
    return ReservedEvent(node=NODE, pod=pod, container="main", vendor_resource=VENDOR, state=state,  # type: ignore[arg-type]
                        devices=cards)


def shadow(*cards: str, state: str = "running") -> ShadowEvent:
    return ShadowEvent(node=NODE, shadow_pod=SHADOW, state=state, resource="share-gpu-2",  # type: ignore[arg-type]
                       share_spec=2, vendor_resource=VENDOR, devices=cards)


def borrow(pod: str, *spot: str, state: str = "using") -> SpotEvent:
    return SpotEvent(node=NODE, pod=pod, container="main", state=state, devices=spot)  # type: ignore[arg-type]


def healthy(reason: str, *spot: str) -> SetHealth:
    return SetHealth(resource="spot-gpu", reason=reason, devices=dict.fromkeys(spot, "Healthy"))


def unhealthy(reason: str, *spot: str) -> SetHealth:
    return SetHealth(resource="spot-gpu", reason=reason, devices=dict.fromkeys(spot, "Unhealthy"))


def lent_free_cards() -> SolverState:
    """GPU-0 and GPU-1 free and lent; spot/b0 borrows spot-GPU-0."""
    state = SolverState()
    handle(inventory("GPU-0", "GPU-1"), state)
    handle(borrow("spot/b0", "spot-GPU-0"), state)
    return state


def test_unallocated_cards_become_healthy_and_borrowable() -> None:
    state = SolverState()
    actions = handle(inventory("GPU-0", "GPU-1"), state)
    assert actions == [healthy(f"unallocated {VENDOR}", "spot-GPU-0", "spot-GPU-1")]
    assert state.cache.snapshot() == {IDLE_SPACE: {"spot-GPU-0": "", "spot-GPU-1": ""}}
    assert handle(inventory("GPU-0", "GPU-1"), state) == []  # a resync's republication: nothing new
    assert handle(inventory("GPU-1", "GPU-0"), state) == []


@pytest.mark.parametrize("holding", [
    pytest.param([reserved("infer/big", "GPU-1")], id="reserved-pod"),
    pytest.param([shadow("GPU-1")], id="shadow-pod"),
    pytest.param([reserved("dev/alice", "GPU-1"),
                  LowPowerEvent(node=NODE, owner="dev/alice", using=False, devices=("GPU-1",)),
                  LowPowerEvent(node=NODE, owner="dev/alice", using=True, devices=("GPU-1",))],
                 id="owner-back"),
])
def test_only_cards_nobody_holds_are_lent(holding: list[object]) -> None:
    state = SolverState()
    for event in holding:
        handle(event, state)  # type: ignore[arg-type]
    actions = handle(inventory("GPU-0", "GPU-1"), state)
    assert actions == [healthy(f"unallocated {VENDOR}", "spot-GPU-0")]
    assert state.lent() == ["spot-GPU-0"]


def test_cards_of_an_away_owner_are_already_lent() -> None:
    state = SolverState()
    handle(reserved("dev/alice", "GPU-0"), state)
    handle(LowPowerEvent(node=NODE, owner="dev/alice", using=False, devices=("GPU-0",)), state)
    assert handle(inventory("GPU-0", "GPU-1"), state) == [healthy(f"unallocated {VENDOR}", "spot-GPU-1")]
    assert sorted(state.lent()) == ["spot-GPU-0", "spot-GPU-1"]


@pytest.mark.parametrize("away_first", [True, False], ids=["away-then-gone", "gone-then-away"])
def test_an_away_owners_card_back_in_the_inventory_is_lent_again(away_first: bool) -> None:
    """A kubelet restarting lists no devices until its plugins register again: the away owner's
    card leaves the inventory and comes back, and must be lent again (a soak saw it stay
    withdrawn for good, its owner away with nothing to lend)."""
    state = SolverState()
    handle(inventory("GPU-0", "GPU-1"), state)
    handle(reserved("dev/alice", "GPU-0"), state)
    away = LowPowerEvent(node=NODE, owner="dev/alice", using=False, devices=("GPU-0",))
    events = [away, inventory()] if away_first else [inventory(), away]
    for event in events:
        handle(event, state)  # type: ignore[arg-type]
    assert state.lent() == [] and state.kind_of("dev/alice") == "spot-owner"
    actions = handle(inventory("GPU-0", "GPU-1"), state)
    assert actions == [healthy(f"unallocated {VENDOR}", "spot-GPU-0", "spot-GPU-1")]
    assert sorted(state.lent()) == ["spot-GPU-0", "spot-GPU-1"]


def test_a_card_gone_from_the_inventory_is_withdrawn_and_its_borrowers_evicted() -> None:
    state = lent_free_cards()
    actions = handle(inventory("GPU-1"), state)
    assert actions == [unhealthy("card-gone", "spot-GPU-0"),
                       Reclaim(reason="card-gone", pods=("spot/b0",), lent=("spot-GPU-0",))]
    assert state.lent() == ["spot-GPU-1"] and state.borrowers() == {}
    assert handle(inventory("GPU-1"), state) == []
    assert handle(inventory("GPU-0", "GPU-1"), state) == [healthy(f"unallocated {VENDOR}", "spot-GPU-0")]


def test_a_held_card_gone_is_unhealthy_without_eviction() -> None:
    state = SolverState()
    handle(reserved("infer/big", "GPU-0"), state)
    handle(inventory("GPU-0"), state)
    assert handle(inventory(), state) == [unhealthy("card-gone", "spot-GPU-0")]
    assert state.kind_of("infer/big") == "reserved"


def test_a_reserved_pod_taking_a_free_card_evicts_its_borrowers() -> None:
    state = lent_free_cards()
    actions = handle(reserved("infer/big", "GPU-0"), state)
    assert actions == [unhealthy("reserved by infer/big", "spot-GPU-0"),
                       Reclaim(reason="reserved", pods=("spot/b0",), owner="infer/big", lent=("spot-GPU-0",))]
    assert state.lent() == ["spot-GPU-1"]
    assert handle(reserved("infer/big", "GPU-0", state="cleared"), state) == [
        healthy("released by infer/big", "spot-GPU-0")]


def test_a_shadow_pod_taking_a_free_card_evicts_its_borrowers() -> None:
    state = lent_free_cards()
    actions = handle(shadow("GPU-0"), state)
    assert actions == [unhealthy(f"reserved by {SHADOW}", "spot-GPU-0"),
                       Reclaim(reason="reserved", pods=("spot/b0",), owner=SHADOW, lent=("spot-GPU-0",)),
                       DeviceList(resource="share-gpu-2", devices=(f"{SHADOW}-0", f"{SHADOW}-1"),
                                  reason=f"shadow {SHADOW} running")]
    assert state.lent() == ["spot-GPU-1"] and state.shadow_cards == {SHADOW: ("GPU-0",)}
    assert handle(shadow("GPU-0"), state) == []  # republished: nothing new
    assert handle(borrow("spot/late", "spot-GPU-0"), state) == [
        Reclaim(reason="reserved", pods=("spot/late",), owner=SHADOW)]


def test_a_shadow_pod_gone_frees_its_card() -> None:
    state = SolverState()
    handle(shadow("GPU-0"), state)
    handle(inventory("GPU-0"), state)
    assert state.lent() == []
    actions = handle(shadow("GPU-0", state="cleared"), state)
    assert actions == [healthy(f"released by {SHADOW}", "spot-GPU-0"),
                       DeviceList(resource="share-gpu-2", devices=(), reason=f"shadow {SHADOW} cleared")]
    assert state.lent() == ["spot-GPU-0"] and state.shadow_cards == {}


def test_a_card_released_outside_the_inventory_is_not_lent() -> None:
    state = SolverState()
    handle(inventory("GPU-1"), state)
    handle(reserved("infer/big", "GPU-0"), state)
    assert handle(reserved("infer/big", "GPU-0", state="cleared"), state) == []
    assert state.lent() == ["spot-GPU-1"]


def test_a_spot_pod_on_a_card_gone_is_evicted() -> None:
    state = SolverState()
    handle(inventory("GPU-1"), state)
    assert handle(borrow("spot/stale", "spot-GPU-0"), state) == [
        Reclaim(reason="card-gone", pods=("spot/stale",))]
    assert state.borrowers() == {}


def test_reconcile_evicts_borrowers_on_a_shadow_pods_card() -> None:
    state = lent_free_cards()
    state.shadow_cards[SHADOW] = ("GPU-0",)  # known before a restart, borrower recorded before it
    actions = reconcile(state, NODE, {"spot/b0", SHADOW})
    assert actions == [Reclaim(reason="reserved", pods=("spot/b0",), owner=SHADOW)]


@pytest.mark.parametrize("cards", [("",), ("bad id",), ("GPU-0", "-x")])
def test_a_malformed_card_id_is_a_typed_error(cards: tuple[str, ...]) -> None:
    state = SolverState()
    with pytest.raises(HandlerError):
        handle(inventory(*cards), state)
    assert state.inventory == {}
    with pytest.raises(HandlerError):
        handle(shadow(*cards), state)


def test_after_a_rebuild_the_inventory_lends_nothing_until_the_holdoff_ends() -> None:
    now = [1000.0]
    state = SolverState(lend_after=1200.0, clock=lambda: now[0])
    handle(borrow("spot/b0", "spot-GPU-0"), state)  # rebuilt from a signed Allocate annotation
    assert handle(inventory("GPU-1", "GPU-2"), state) == [
        unhealthy("card-gone", "spot-GPU-0"), Reclaim(reason="card-gone", pods=("spot/b0",), lent=("spot-GPU-0",))]
    assert state.lent() == []  # who holds GPU-1 and GPU-2 is not known yet
    now[0] = 1200.0
    assert handle(inventory("GPU-1", "GPU-2"), state) == [
        healthy(f"unallocated {VENDOR}", "spot-GPU-1", "spot-GPU-2")]
