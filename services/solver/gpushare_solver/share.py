"""ShareGPU transitions: ShadowPods come and go, SharePods use their devices.

See docs/state-machines.md, 'Solver ShadowPods and SharePods'.
"""

from __future__ import annotations

from gpushare_common.events import ShadowEvent, ShareEvent
from gpushare_common.ids import IdError, parse_pod_key, share_device_ids
from gpushare_common.mapping import MappingError

from . import cards
from .actions import Action, DeviceList, OwnerAnnotation, Reclaim, UsingCondition
from .state import SHADOW, HandlerError, SolverState

SHADOW_GONE = "shadow-gone"


def shadow_running(event: ShadowEvent, state: SolverState) -> list[Action]:
    try:
        namespace, name = parse_pod_key(event.shadow_pod)
        devices = share_device_ids(namespace, name, event.share_spec) if event.share_spec > 0 else []
        cards.spot_ids(event.devices)
    except IdError as err:
        raise HandlerError(event.id, str(err)) from None
    if event.devices:
        state.shadow_cards[event.shadow_pod] = tuple(event.devices)
    actions = cards.taken(event.shadow_pod, event.devices, state)
    was_terminating = event.shadow_pod in state.terminating
    if event.terminating:
        state.terminating.add(event.shadow_pod)
    else:
        state.terminating.discard(event.shadow_pod)
    changed = state.cache.create(event.shadow_pod, devices, kind=SHADOW, resource=event.resource)
    if not changed and was_terminating == event.terminating:
        return actions
    return [*actions, DeviceList(resource=event.resource, devices=state.devices_of_resource(event.resource),
                                 reason=f"shadow {event.shadow_pod} running")]


def shadow_cleared(event: ShadowEvent, state: SolverState) -> list[Action]:
    """The ShadowPod is gone: its users are evicted, its cards lent — unless a container still
    holds one of its virtual devices (the ShadowPod's cards stay withheld until none does)."""
    state.terminating.discard(event.shadow_pod)
    held = state.shadow_cards.get(event.shadow_pod, ())  # named in its users' eviction Events
    withheld = state.still_held(event.shadow_pod)
    freed = [] if withheld else cards.lend_free(state.shadow_cards.pop(event.shadow_pod, ()), state,
                                                f"released by {event.shadow_pod}")
    entry = state.cache.get(event.shadow_pod)
    if entry is None:
        return freed
    users = sorted(state.cache.users_of(event.shadow_pod))
    for user in users:
        state.take_out(user, event.shadow_pod, cards=held)
    state.cache.delete(event.shadow_pod)
    resource = entry.resource or event.resource
    actions: list[Action] = []
    if users:
        actions.append(Reclaim(reason=SHADOW_GONE, pods=tuple(users), owner=event.shadow_pod))
    actions += freed
    actions.append(DeviceList(resource=resource, devices=state.devices_of_resource(resource),
                              reason=f"shadow {event.shadow_pod} cleared"))
    return actions


def _usable_owner(device: str, state: SolverState) -> str | None:
    owner = state.cache.owner_of(device)
    if owner is None or state.kind_of(owner) != SHADOW or owner in state.terminating:
        return None
    return owner


def share_using(event: ShareEvent, state: SolverState) -> list[Action]:
    owners = {device: _usable_owner(device, state) for device in event.devices}
    if any(owner is None for owner in owners.values()):
        gone = next(d for d, o in owners.items() if o is None)
        holder = state.cache.owner_of(gone) or ""
        state.take_out(event.share_pod, holder, event.pod_uid, event.devices)
        return [Reclaim(reason=SHADOW_GONE, pods=(event.share_pod,), owner=holder)]
    changed: set[str] = set()
    for device, owner in owners.items():
        assert owner is not None
        try:
            if state.cache.use(owner, event.share_pod, device, event.pod_uid):
                changed.add(owner)
        except MappingError as err:
            raise HandlerError(event.id, str(err)) from None
    actions: list[Action] = []
    for owner in sorted(changed):
        actions.append(condition(owner, state))
        actions.append(OwnerAnnotation(share_pod=event.share_pod, shadow_pod=owner))
    return actions


def share_cleared(event: ShareEvent, state: SolverState) -> list[Action]:
    if event.devices:
        pairs = [(state.cache.owner_of(d), d) for d in event.devices]
        freed = {o for o, d in pairs if o is not None and state.cache.unuse(o, event.share_pod, d)}
    else:
        freed = {o for o, _ in state.cache.unuse_everywhere(event.share_pod)}
    return [condition(owner, state) for owner in sorted(freed) if state.kind_of(owner) == SHADOW]


def condition(owner: str, state: SolverState) -> UsingCondition:
    users = {d: u for d, u in state.cache.snapshot().get(owner, {}).items() if u}
    return UsingCondition(shadow_pod=owner, users=users)
