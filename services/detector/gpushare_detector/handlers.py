"""Pure functions: a pod and its devices -> the events that describe it (see docs/events.md, 'Payloads').

Each pod yields *facts*, one event per (kind, pod, container, resource).  An
event's id is a hash of its content and the pod's uid, so republishing the
same state (the periodic resync, a restarted detector) produces the same id:
JetStream drops the duplicate and the solver's handlers see nothing new.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping

import msgspec
from gpushare_common import events as ev
from gpushare_common.pods import Pod as PodView
from gpushare_common.pods import PodKind, PodRules
from gpushare_common.subjects import resource_token

from .model import DevicesOf, FactKey

Facts = dict[FactKey, ev.Event]
KIND_OF: dict[type[ev.Event], str] = {
    ev.ShadowEvent: "shadow", ev.ShareEvent: "share", ev.ReservedEvent: "generic",
    ev.SpotEvent: "spot", ev.LowPowerEvent: "lowpower", ev.CardInventory: "inventory",
}


def stable_id(event: ev.Event, salt: str) -> str:
    body = ev.encode(msgspec.structs.replace(event, id="", ts=0.0))
    return hashlib.blake2b(body + salt.encode(), digest_size=16).hexdigest()


def with_stable_id(event: ev.Event, salt: str) -> ev.Event:
    return msgspec.structs.replace(event, id=stable_id(event, salt))


def kind_of(event: ev.Event) -> str:
    return KIND_OF[type(event)]


def fact_key(event: ev.Event) -> FactKey:
    """(kind, pod, container, resource) of a pod fact, read back from the event itself."""
    match event:
        case ev.ShadowEvent():
            return ("shadow", event.shadow_pod, event.container, event.vendor_resource)
        case ev.ShareEvent():
            return ("share", event.share_pod, event.container, event.resource)
        case ev.SpotEvent():
            return ("spot", event.pod, event.container, "")
        case ev.ReservedEvent():
            return ("generic", event.pod, event.container, event.vendor_resource)
    raise ValueError(f"not a pod fact: {kind_of(event)}")


def _vendor_devices(rules: PodRules, devices: Mapping[str, tuple[str, ...]]) -> tuple[str, tuple[str, ...]]:
    for resource in rules.vendor_resources:
        if devices.get(resource):
            return resource, devices[resource]
    return "", ()


def _shadow(view: PodView, rules: PodRules, node: str, devices: DevicesOf) -> list[ev.Event]:
    vendor, real = _vendor_devices(rules, devices.get("main", {}))
    if view.phase != "Running" or not real or view.share is None:
        return []
    event = ev.ShadowEvent(
        node=node, shadow_pod=view.key, state="running", resource=view.share.resource,
        share_kind=view.share.kind, share_spec=view.share.count, container="main",
        vendor_resource=vendor, devices=real, terminating=view.terminating,
    )
    return [event]


def _per_container(view: PodView, devices: DevicesOf, wanted: Callable[[str], bool]
                   ) -> Iterable[tuple[str, str, tuple[str, ...]]]:
    """(container, resource, device ids) for each requested resource the kubelet allocated (for
    a container using DRA claims: each resource its claims' devices stand for)."""
    claimed = {c: tuple(r for r in devices.get(c, {}) if wanted(r)) for c in view.claims}
    for container, resources in {**view.requesting(wanted), **claimed}.items():
        for resource in resources:
            allocated = devices.get(container, {}).get(resource, ())
            if allocated:
                yield container, resource, allocated


def _share(view: PodView, rules: PodRules, node: str, devices: DevicesOf) -> list[ev.Event]:
    return [
        ev.ShareEvent(node=node, share_pod=view.key, container=container, state="using",
                      resource=resource_token(resource, rules.domain), devices=ids, pod_uid=view.uid)
        for container, resource, ids in _per_container(view, devices, rules.is_share)
    ]


def _spot(view: PodView, rules: PodRules, node: str, devices: DevicesOf) -> list[ev.Event]:
    return [
        ev.SpotEvent(node=node, pod=view.key, container=container, state="using", devices=ids,
                     priority=view.priority, pod_uid=view.uid)
        for container, _, ids in _per_container(view, devices, rules.spot_resource.__eq__)
    ]


def _generic(view: PodView, rules: PodRules, node: str, devices: DevicesOf) -> list[ev.Event]:
    vendor = set(rules.vendor_resources)
    return [
        ev.ReservedEvent(node=node, pod=view.key, container=container, vendor_resource=resource,
                        state="using", devices=ids, lendable=view.lendable, pod_uid=view.uid)
        for container, resource, ids in _per_container(view, devices, vendor.__contains__)
    ]


_BUILDERS = {
    PodKind.SHADOW: _shadow, PodKind.SHARE: _share, PodKind.SPOT: _spot,
    PodKind.RESERVED: _generic,
}


def _dra_kind(view: PodView, rules: PodRules, devices: DevicesOf) -> PodKind:
    """What a pod of claims is, from what its claims hold."""
    held = {r for c in view.claims for r in devices.get(c, {})}
    if rules.spot_resource in held:
        return PodKind.SPOT
    return PodKind.RESERVED if held & set(rules.vendor_resources) else view.kind


def pod_facts(view: PodView, rules: PodRules, node: str, devices: DevicesOf) -> Facts:
    """The events that describe ``view`` now (empty when it finished or holds nothing)."""
    if view.claims:
        devices = rules.claimed_devices(devices)
        if view.kind is PodKind.ORDINARY:
            view = msgspec.structs.replace(view, kind=(kind := _dra_kind(view, rules, devices)),
                                           lendable=kind is PodKind.RESERVED and view.lendable_label)
    builder = _BUILDERS.get(view.kind)
    if builder is None or view.finished:
        return {}
    events = (with_stable_id(event, view.uid) for event in builder(view, rules, node, devices))
    return {fact_key(event): event for event in events}


def cleared(event: ev.Event) -> ev.Event | None:
    """The event that withdraws ``event``; None for facts that need no withdrawal."""
    match event:
        case ev.ShadowEvent():
            gone: ev.Event = msgspec.structs.replace(event, state="cleared", terminating=True)
        case ev.ShareEvent() | ev.ReservedEvent() | ev.SpotEvent():
            gone = msgspec.structs.replace(event, state="cleared")
        case _:
            return None
    return msgspec.structs.replace(gone, id=stable_id(gone, event.id), ts=ev.now())


def plan(published: Facts, desired: Facts) -> list[ev.Event]:
    """Events that move the world from ``published`` to ``desired``: clears first."""
    out = [c for k, e in published.items() if k not in desired and (c := cleared(e)) is not None]
    out.extend(e for k, e in desired.items() if (old := published.get(k)) is None or old.id != e.id)
    return out
