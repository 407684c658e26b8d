"""Event -> state change + actions: the solver's decisions, free of I/O.

``handle(event, state)`` mutates ``state`` (the MappingCache, desired health,
terminating ShadowPods) and returns the actions the executor must carry out.
Events the solver does not consume yield no actions.
"""

from __future__ import annotations

from gpushare_common.events import (
    AnyEvent,
    CardInventory,
    LowPowerEvent,
    OwnerBackEvent,
    ReservedEvent,
    ShadowEvent,
    ShareEvent,
    SpotEvent,
)

from . import cards, share, spot
from .actions import Action
from .state import SolverState


def handle(event: AnyEvent, state: SolverState) -> list[Action]:
    match event:
        case ShadowEvent(state="running"):
            return share.shadow_running(event, state)
        case ShadowEvent():
            return share.shadow_cleared(event, state)
        case ShareEvent(state="using"):
            return share.share_using(event, state)
        case ShareEvent():
            return share.share_cleared(event, state)
        case ReservedEvent(state="using"):
            return spot.reserved_using(event, state)
        case ReservedEvent():
            return spot.reserved_cleared(event, state)
        case LowPowerEvent():
            return spot.lowpower(event, state)
        case OwnerBackEvent():
            return spot.kernel_owner_back(event, state)
        case SpotEvent(state="using"):
            return spot.spot_using(event, state)
        case SpotEvent():
            return spot.spot_cleared(event, state)
        case CardInventory():
            return cards.inventory(event, state)
        case _:
            return []
