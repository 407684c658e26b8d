"""Start-up reconciliation: make the loaded MappingCache agree with the pods that exist.

Pure: given the state and the set of pod keys present on the node, return the
actions (and apply the state changes) that a stream of "cleared" events would
have produced, plus the eviction of borrowers on cards whose owner is active.
"""

from __future__ import annotations

from gpushare_common.events import ReservedEvent, ShadowEvent
from gpushare_common.ids import IdError, parse_spot_device_id

from . import cards, share, spot
from .actions import Action, Reclaim
from .state import DRA_SHARES, RESERVED, SHADOW, SPOT_OWNER, SolverState


def _cleared_owners(state: SolverState, node: str, present: set[str]) -> list[Action]:
    actions: list[Action] = []
    for owner in state.cache.owners(SHADOW):
        if owner not in present:
            actions += share.shadow_cleared(ShadowEvent(node=node, shadow_pod=owner, state="cleared"), state)
    for kind in (RESERVED, SPOT_OWNER):
        for owner in state.cache.owners(kind):
            if owner not in present:
                event = ReservedEvent(node=node, pod=owner, container="", vendor_resource="",
                                     state="cleared")
                actions += spot.reserved_cleared(event, state)
    return actions


def _gone_users(state: SolverState, present: set[str]) -> list[Action]:
    snapshot = state.cache.snapshot()
    users = {u for devices in snapshot.values() for u in devices.values() if u}
    touched: set[str] = set()
    for user in sorted(users - present):
        touched.update(owner for owner, _ in state.cache.unuse_everywhere(user))
    return [share.condition(o, state) for o in sorted(touched) if state.kind_of(o) == SHADOW]


def _borrowers_on_active_cards(state: SolverState) -> list[Action]:
    actions: list[Action] = []
    for device, borrower in sorted(state.borrowers().items()):
        try:
            holder = state.holder_of(parse_spot_device_id(device), active_only=True)
        except IdError:
            continue
        if holder is not None:
            state.take_out(borrower, owner=holder)  # a victim on record: the reclaim verifies it
            reason = cards.RESERVED_REASON if holder in state.shadow_cards or holder == DRA_SHARES else spot.OWNER_BACK
            actions.append(Reclaim(reason=reason, pods=(borrower,), owner=holder))
    return actions


def reconcile(state: SolverState, node: str, present: set[str]) -> list[Action]:
    actions = _cleared_owners(state, node, present)
    actions += _gone_users(state, present)
    actions += _borrowers_on_active_cards(state)
    return actions
