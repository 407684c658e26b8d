"""Real cards and their ``spot-<id>`` mirrors: who holds a card, which cards are free.

See docs/state-machines.md, 'Solver card states'.

A card is *free* when it is in the node's card inventory (what the kubelet can
allocate) and no reserved pod, away owner or ShadowPod holds it: its spot
device is lent (in ``idle-space``) and Healthy. A card that leaves the
inventory is withdrawn: Unhealthy, its borrowers reclaimed (``card-gone``).
A card taken by a reserved pod or a ShadowPod is withdrawn the same way
(``reserved``), whether it was lent because its owner was away or because no
pod held it.

The solver's own view is checked against the kubelet's before a card is lent
(:class:`~.state.KubeletView`, read just before the event): a card some
container holds that the solver knows no holder of is not lent, nor the cards
of a ShadowPod gone while a container still holds one of its virtual devices
(the ShadowPod stays in ``shadow_cards`` until none does). The next inventory
lends them once the kubelet lists nothing holding them.

On a DRA node the driver's inventory names the cards its share claims use (``shared``): a
share claim holds no card the kubelet lists, so they count as held (``DRA_SHARES``), withdrawn
like a card a ShadowPod takes, and lent again once no share uses them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpushare_common.events import CardInventory
from gpushare_common.ids import IdError, parse_share_device_id, parse_spot_device_id, spot_device_id
from gpushare_common.pods import PodRules

from .actions import Action, Reclaim, SetHealth
from .state import DRA_SHARES, HandlerError, KubeletView, SolverState

# pod-resources' answer for the node: "<ns>/<pod>" -> container -> resource -> device IDs
Listing = Mapping[str, Mapping[str, Mapping[str, tuple[str, ...]]]]

CARD_GONE = "card-gone"
RESERVED_REASON = "reserved"


def spot_ids(cards: Iterable[str]) -> list[str]:
    return [spot_device_id(c) for c in cards]


def health(state: SolverState, spot: list[str], healthy: bool, reason: str) -> SetHealth:
    return SetHealth(resource=state.spot_resource, reason=reason,
                     devices=state.set_health(spot, "Healthy" if healthy else "Unhealthy"))


def lend_free(cards: Iterable[str], state: SolverState, reason: str) -> list[Action]:
    """Lend those of ``cards`` that are lendable now (in the inventory, held by no active holder:
    by nobody, or by an owner who is away): Healthy. An away owner's card that left the
    inventory for a while (a kubelet restarting lists no devices until its plugins register
    again) is lent again when it comes back."""
    lendable = [c for c in dict.fromkeys(cards)
                if state.in_inventory(c) and state.holder_of(c, active_only=True) is None]
    free = [c for c in lendable if not state.held_unknown(c)]
    state.withheld.update(c for c in lendable if c not in free)
    if not free:
        return []
    spot = spot_ids(free)
    state.lend(spot)
    return [health(state, spot, True, reason)]


def withdraw(cards: Iterable[str], state: SolverState, reason: str, owner: str = "") -> list[Action]:
    """Take cards' spot devices out of ``idle-space``: Unhealthy, their borrowers reclaimed."""
    spot = spot_ids(dict.fromkeys(cards))
    if not spot:
        return []
    lent = tuple(d for d in spot if d in state.lent())
    borrowers = state.withdraw(spot)
    why = f"reserved by {owner}" if reason == RESERVED_REASON else reason
    actions: list[Action] = [health(state, spot, False, why)]
    if borrowers or lent:
        actions.append(Reclaim(reason=reason, pods=tuple(borrowers), owner=owner, lent=lent))
    return actions


def taken(owner: str, cards: Iterable[str], state: SolverState) -> list[Action]:
    """A ShadowPod holds ``cards``: withdraw those that were lent or announced Healthy."""
    lent = set(state.lent())
    spot = spot_ids(cards)
    if not any(d in lent or state.health.get(d) == "Healthy" for d in spot):
        return []
    return withdraw(cards, state, RESERVED_REASON, owner)


def inventory(event: CardInventory, state: SolverState) -> list[Action]:
    """The cards the kubelet can allocate for one vendor resource, in full."""
    try:
        spot_ids(event.devices)
    except IdError as err:
        raise HandlerError(event.id, str(err)) from None
    old = state.inventory.get(event.vendor_resource, ())
    state.inventory[event.vendor_resource] = tuple(dict.fromkeys(event.devices))
    shared = tuple(c for c in dict.fromkeys(event.shared) if c in event.devices)
    if shared:
        state.dra_shared[event.vendor_resource] = shared
    else:
        state.dra_shared.pop(event.vendor_resource, None)
    for shadow in [s for s in state.shadow_cards if state.cache.get(s) is None and not state.still_held(s)]:
        del state.shadow_cards[shadow]  # a ShadowPod gone whose virtual devices nobody holds any more
    known = [*old, *(parse_spot_device_id(d) for d in state.lent())]
    gone = [c for c in dict.fromkeys(known) if not state.in_inventory(c)]
    lent, healthy = set(state.lent()), {d for d, h in state.health.items() if h == "Healthy"}
    news = [c for c in event.devices
            if spot_device_id(c) not in lent or spot_device_id(c) not in healthy]
    actions = withdraw(gone, state, CARD_GONE) + taken(DRA_SHARES, shared, state)
    if state.clock() < state.lend_after:  # rebuilt: who holds the cards is not known yet
        return actions
    return actions + lend_free(news, state, f"unallocated {event.vendor_resource}")


def kubelet_view(listing: Listing, rules: PodRules, vendor_resources: Iterable[str]) -> KubeletView:
    """The cards and ShadowPods some container of the node holds, as the kubelet says."""
    vendors, held, shadows = set(vendor_resources) | set(rules.vendor_resources), set[str](), set[str]()
    for containers in listing.values():
        for resources in rules.claimed_devices(containers).values():
            for resource, found in resources.items():
                if resource in vendors:
                    held.update(found)
                elif rules.is_share(resource):
                    shadows.update(_shadow_of(device) for device in found)
    shadows.discard("")
    return KubeletView(frozenset(held), frozenset(shadows))


def _shadow_of(device: str) -> str:
    try:
        share = parse_share_device_id(device)
    except IdError:
        return ""
    return f"{share.namespace}/{share.shadow_pod}"
