"""Property tests: eviction record ids, and random event sequences against the handlers."""

from __future__ import annotations

from gpushare_common.events import (
    CardInventory,
    LowPowerEvent,
    OwnerBackEvent,
    ReservedEvent,
    ShadowEvent,
    SpotEvent,
)
from gpushare_common.ids import parse_spot_device_id
from gpushare_solver.handlers import handle
from gpushare_solver.reclaim import record_id
from gpushare_solver.state import HandlerError, SolverState
from hypothesis import given, settings
from hypothesis import strategies as st

NODE = "n1"


@given(st.text(max_size=20), st.text(max_size=20))
def test_record_ids_are_deterministic_and_distinct(trigger: str, pod: str) -> None:
    assert record_id(trigger, pod) == record_id(trigger, pod)
    assert record_id(trigger, pod) != record_id(trigger, pod + "x")


OWNERS = st.sampled_from(["dev/a", "dev/b"])
CARDS = st.lists(st.sampled_from(["GPU-0", "GPU-1", "GPU-2"]), min_size=1, max_size=2, unique=True)
EVENTS = st.one_of(
    st.builds(lambda o, d, s: ReservedEvent(node=NODE, pod=o, container="c", vendor_resource="v", state=s,
                                           devices=tuple(d)), OWNERS, CARDS, st.sampled_from(["using", "cleared"])),
    st.builds(lambda o, d, u: LowPowerEvent(node=NODE, owner=o, using=u, devices=tuple(d)), OWNERS, CARDS,
              st.booleans()),
    st.builds(lambda o: OwnerBackEvent(node=NODE, pidns=1, pid=1, kernel_ts_ns=1, pod=o), OWNERS),
    st.builds(lambda p, d, s: SpotEvent(node=NODE, pod=p, container="c", state=s,
                                        devices=tuple(f"spot-{x}" for x in d)),
              st.sampled_from(["spot/x", "spot/y"]), CARDS, st.sampled_from(["using", "cleared"])),
    st.builds(lambda d: CardInventory(node=NODE, vendor_resource="v", devices=tuple(d)),
              st.lists(st.sampled_from(["GPU-0", "GPU-1", "GPU-2"]), max_size=3, unique=True)),
    st.builds(lambda d, s: ShadowEvent(node=NODE, shadow_pod="t/sh", state=s, resource="share-gpu-2",
                                       share_spec=2, devices=tuple(d)),
              CARDS, st.sampled_from(["running", "cleared"])),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(EVENTS, max_size=25))
def test_no_borrower_stays_on_a_card_held_by_an_active_owner_or_gone(events: list[object]) -> None:
    state = SolverState()
    for event in events:
        try:
            handle(event, state)  # type: ignore[arg-type]
        except HandlerError:
            continue
        for device, borrower in state.borrowers().items():
            card = parse_spot_device_id(device)
            assert state.holder_of(card, active_only=True) is None, (device, borrower)
            assert state.in_inventory(card), (device, borrower)
        healthy = {d for d, h in state.health.items() if h == "Healthy"}
        assert healthy <= set(state.lent()), healthy - set(state.lent())
