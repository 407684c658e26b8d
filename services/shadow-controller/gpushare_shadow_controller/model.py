"""Slim records of the pods the controller cares about, classified once per watch event.

Only these records are kept (never whole pod objects), so 10,000 pods cost
little memory and a reconcile pass touches small objects only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpushare_common import ids
from gpushare_common.isolation import SOFT_SHARE
from gpushare_common.mapping import QuotaKey
from gpushare_common.pods import PodError, PodKind, PodRules, read_pod

from .placement import ANYWHERE, Placement


@dataclass(slots=True)
class SharePod:
    key: str
    quota: QuotaKey
    count: int  # virtual devices requested
    node: str
    pending: bool  # waiting for devices: not scheduled, not terminating
    active: bool  # bound to a node and not finished or terminating
    owner: str  # gpushare.k8s.io/device-owner, "" until the solver sets it
    uid: str = ""
    caps: str = ""  # its CapsEnforced condition's status: True, False, "" when it has none
    opted_out: bool = False  # gpushare.k8s.io/isolation: none (runs without its caps)
    placement: Placement = ANYWHERE  # the nodes it may run on (only read while it is pending)


@dataclass(slots=True)
class ShadowPod:
    key: str
    name: str
    quota: QuotaKey
    node: str
    phase: str
    terminating: bool
    created: str
    using: int  # devices marked used by Using conditions
    isolation: str = ""  # its isolation profile (gpushare.k8s.io/isolation), "" for a soft share
    ready: bool = False
    restarts: int = 0  # of its container main
    card: str = ""  # the vendor resource it holds one card of
    users: tuple[str, ...] = ()  # SharePods in its Using condition (kept for capped ShadowPods only)
    placement: Placement = ANYWHERE  # the SharePods' node constraints it was made for


Record = SharePod | ShadowPod


def classify(pod: dict[str, Any], rules: PodRules) -> Record | None:
    """A slim record of a ShadowPod (the platform's own: :mod:`gpushare_common.pods`) or a
    SharePod; None for any other pod, or one that does not read. Every SharePod, whatever its
    namespace, draws on the ShadowPods of the system namespace: its quota key names that."""
    try:
        view = read_pod(pod, rules)
    except PodError:
        return None
    if view.share is None:
        return None
    quota = QuotaKey(rules.system_namespace, view.share.kind, view.share.count)
    if view.kind is PodKind.SHADOW:
        cards = [r for rs in view.containers.values() for r in rs if r in rules.vendor_resources]
        return ShadowPod(view.key, view.name, quota, view.node, view.phase or "Pending", view.terminating,
                         view.created, len(view.using), isolation=view.isolation, ready=view.ready,
                         restarts=view.restarts.get(ids.SHADOW_CONTAINER, 0), card=cards[0] if cards else "",
                         users=tuple(sorted(set(view.using.values()))) if view.isolation else (),
                         placement=Placement.of_annotation(_annotation(pod, ids.ANN_PLACEMENT)))  # fmt: skip
    if view.kind is PodKind.SHARE and _served_by_dra(pod):
        return None  # its share comes from a DRA node's slot (KEP-5004), not from a ShadowPod
    if view.kind is PodKind.SHARE:
        waiting = not view.node and not view.terminating and not view.finished
        return SharePod(view.key, quota, view.share_devices, view.node, pending=waiting,
                        active=view.active, owner=view.device_owner, uid=view.uid,
                        caps=view.conditions.get(ids.CONDITION_CAPS_ENFORCED, ""),
                        opted_out=view.isolation == SOFT_SHARE,
                        placement=Placement.of_pod(pod) if waiting else ANYWHERE)  # fmt: skip
    return None


def _annotation(pod: dict[str, Any], name: str) -> object:
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    return annotations.get(name) if isinstance(annotations, dict) else None


def _served_by_dra(pod: dict[str, Any]) -> bool:
    """The scheduler gave the pod's extended resources a DRA claim (``extendedResourceClaimStatus``)."""
    found = (pod.get("status") or {}).get("extendedResourceClaimStatus")
    return isinstance(found, dict) and bool(found.get("requestMappings"))
