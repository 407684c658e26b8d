"""Start-up reconciliation (pure): pods gone are cleaned up, borrowers of active owners evicted."""

from __future__ import annotations

from gpushare_common.events import LowPowerEvent, ReservedEvent, ShadowEvent, ShareEvent, SpotEvent
from gpushare_common.mapping import IDLE_SPACE
from gpushare_solver.actions import DeviceList, Reclaim, SetHealth, UsingCondition
from gpushare_solver.handlers import handle
from gpushare_solver.journal import Seen
from gpushare_solver.reconcile import reconcile
from gpushare_solver.state import RESERVED, SolverState

NODE = "n1"


def loaded() -> SolverState:
    state = SolverState()
    for event in (
        ShadowEvent(node=NODE, shadow_pod="t/sh", state="running", resource="share-gpu-2", share_spec=2),
        ShareEvent(node=NODE, share_pod="apps/p1", container="c", resource="share-gpu-2", state="using",
                   devices=("t/sh-0",)),
        ReservedEvent(node=NODE, pod="dev/alice", container="c", vendor_resource="v", state="using",
                     devices=("GPU-0",)),
        LowPowerEvent(node=NODE, owner="dev/alice", using=False, devices=("GPU-0",)),
        SpotEvent(node=NODE, pod="spot/b1", container="c", state="using", devices=("spot-GPU-0",)),
    ):
        handle(event, state)
    return state


def test_everything_present_changes_nothing() -> None:
    state = loaded()
    before = state.cache.snapshot()
    assert reconcile(state, NODE, {"t/sh", "apps/p1", "dev/alice", "spot/b1"}) == []
    assert state.cache.snapshot() == before


def test_gone_shadow_evicts_its_users_and_refreshes_devices() -> None:
    state = loaded()
    actions = reconcile(state, NODE, {"apps/p1", "dev/alice", "spot/b1"})
    assert actions[:2] == [Reclaim(reason="shadow-gone", pods=("apps/p1",), owner="t/sh"),
                           DeviceList(resource="share-gpu-2", devices=(), reason="shadow t/sh cleared")]


def test_gone_users_are_unused() -> None:
    state = loaded()
    actions = reconcile(state, NODE, {"t/sh", "dev/alice"})
    assert actions == [UsingCondition(shadow_pod="t/sh", users={})]
    assert state.borrowers() == {}


def test_gone_owner_makes_its_cards_borrowable() -> None:
    state = loaded()
    actions = reconcile(state, NODE, {"t/sh", "apps/p1", "spot/b1"})
    assert actions == [SetHealth(resource="spot-gpu", devices={"spot-GPU-0": "Healthy"},
                                 reason="released by dev/alice")]
    assert state.borrowers() == {"spot-GPU-0": "spot/b1"}


def test_borrower_on_a_card_whose_owner_is_active_is_evicted() -> None:
    state = loaded()
    entry = state.cache.get("dev/alice")
    assert entry is not None
    state.cache.create("dev/alice", list(entry.devices), kind=RESERVED)  # back, but still lending
    actions = reconcile(state, NODE, {"t/sh", "apps/p1", "dev/alice", "spot/b1"})
    assert actions == [Reclaim(reason="owner-back", pods=("spot/b1",), owner="dev/alice")]
    assert state.cache.snapshot()[IDLE_SPACE] == {"spot-GPU-0": ""}
    victim = state.evicting["spot/b1"]  # on record, so the reclaim's verification lets it be killed
    assert (victim.owner, victim.devices) == ("dev/alice", ("spot-GPU-0",))


def test_seen_ids_are_bounded_and_ordered() -> None:
    seen = Seen(3)
    for event_id in "abcd":
        seen.add(event_id)
    assert "a" not in seen and "d" in seen
    assert seen.recent(2) == ["c", "d"]
    seen.discard("d")
    assert "d" not in seen
