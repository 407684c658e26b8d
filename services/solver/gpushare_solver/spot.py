"""SpotGPU transitions: owners go away and come back, borrowers borrow.

See docs/state-machines.md, 'Solver card states'.
"""

from __future__ import annotations

from gpushare_common.events import LowPowerEvent, OwnerBackEvent, ReservedEvent, SpotEvent
from gpushare_common.ids import IdError, parse_spot_device_id
from gpushare_common.mapping import IDLE_SPACE, MappingError

from .actions import Action, Kmod, Reclaim, Release
from .cards import CARD_GONE, RESERVED_REASON, lend_free, withdraw
from .cards import health as _health
from .cards import spot_ids as _spot_ids
from .state import RESERVED, SPOT_OWNER, HandlerError, SolverState

OWNER_BACK = "owner-back"


def reserved_using(event: ReservedEvent, state: SolverState) -> list[Action]:
    """A reserved pod holds cards: their spot devices go Unhealthy and borrowers are evicted."""
    entry = state.cache.get(event.pod)
    if entry is not None and entry.kind == SPOT_OWNER and set(entry.devices) == set(event.devices):
        return []  # the owner is away; its holding the cards is not news
    state.cache.create(event.pod, event.devices, kind=RESERVED, resource=event.vendor_resource)
    return withdraw(event.devices, state, RESERVED_REASON, event.pod)


def reserved_cleared(event: ReservedEvent, state: SolverState) -> list[Action]:
    """The cards are free again: their spot devices are borrowable."""
    entry = state.cache.delete(event.pod)
    if entry is None:
        return []
    return lend_free(entry.devices, state, f"released by {event.pod}")


def owner_away(event: LowPowerEvent, state: SolverState) -> list[Action]:
    entry = state.cache.get(event.owner)
    if entry is not None and entry.kind == SPOT_OWNER:
        return []
    devices = list(event.devices) or (list(entry.devices) if entry else [])
    if not devices:
        raise HandlerError(event.id, f"owner {event.owner} is away but holds no known devices")
    state.cache.create(event.owner, devices, kind=SPOT_OWNER, resource=entry.resource if entry else "")
    spot = _spot_ids(d for d in devices if state.in_inventory(d) and state.holder_of(d, active_only=True) is None)
    state.lend(spot)
    return [_health(state, spot, True, f"owner {event.owner} away"),
            Kmod(op="detect", pods=(event.owner,), reason="owner away")]


def owner_back(owner: str, release: Release, state: SolverState) -> list[Action]:
    """Kill and evict the owner's borrowers, withdraw its cards, then release it."""
    entry = state.cache.get(owner)
    spot = _spot_ids(list(entry.devices)) if entry is not None else []
    if entry is None or entry.kind != SPOT_OWNER:  # its cards are not lent: a last look, no more
        return [Reclaim(reason=OWNER_BACK, owner=owner, release=release, lent=tuple(spot))]
    state.cache.create(owner, list(entry.devices), kind=RESERVED, resource=entry.resource)
    borrowers = state.withdraw(spot)
    return [_health(state, spot, False, f"owner {owner} back"),
            Reclaim(reason=OWNER_BACK, pods=tuple(borrowers), owner=owner, release=release, lent=tuple(spot))]


def lowpower(event: LowPowerEvent, state: SolverState) -> list[Action]:
    """The detector's away/back machine moved. Back is news only while the solver still lends
    the owner's cards: after the kernel's owner-back (which the detector echoes as back) the
    return has been handled once, and a second reclaim or release would be noise."""
    if not event.using:
        return owner_away(event, state)
    if state.kind_of(event.owner) != SPOT_OWNER:
        return []
    return owner_back(event.owner, Release(pods=(event.owner,)), state)


def kernel_owner_back(event: OwnerBackEvent, state: SolverState) -> list[Action]:
    release = Release(pods=(event.pod,) if event.pod else (), pidns=(event.pidns,))
    if event.pod:
        return owner_back(event.pod, release, state)
    # The bridge could not name the pod: every away owner may be the one; the owner must win.
    actions: list[Action] = []
    for owner in sorted(state.cache.owners(SPOT_OWNER)):
        actions.extend(a for a in owner_back(owner, Release(pods=(owner,)), state))
    return [*actions, Reclaim(reason=OWNER_BACK, release=release)]


def spot_using(event: SpotEvent, state: SolverState) -> list[Action]:
    if state.evicted.has(event.pod, event.pod_uid):
        return []  # evicted already (found through the kubelet before this event came)
    try:
        reals = {d: parse_spot_device_id(d) for d in event.devices}
    except IdError as err:
        raise HandlerError(event.id, str(err)) from None
    for real in reals.values():
        if (holder := state.holder_of(real, active_only=True)) is not None:
            state.take_out(event.pod, holder, event.pod_uid, event.devices)
            return [Reclaim(reason=RESERVED_REASON, pods=(event.pod,), owner=holder)]
        if not state.in_inventory(real):
            state.take_out(event.pod, IDLE_SPACE, event.pod_uid, event.devices)
            return [Reclaim(reason=CARD_GONE, pods=(event.pod,))]
    state.lend(list(reals))
    for device in reals:
        try:
            state.cache.use(IDLE_SPACE, event.pod, device, event.pod_uid)
        except MappingError as err:
            raise HandlerError(event.id, str(err)) from None
    return []


def spot_cleared(event: SpotEvent, state: SolverState) -> list[Action]:
    if event.devices:
        for device in event.devices:
            state.cache.unuse(IDLE_SPACE, event.pod, device)
    else:
        state.cache.unuse_everywhere(event.pod)
    return []
