"""An eviction told in Kubernetes' own terms, as pure functions: the pod's ``DisruptionTarget``
condition and a core/v1 Event on it.

Before it deletes a pod it evicts, the solver sets the pod's ``DisruptionTarget`` condition
(status True, a reason naming the cause), as the kubelet and the taint manager do, so that a
Job's ``podFailurePolicy`` rule ``onPodConditions: [{type: DisruptionTarget}]`` can tell the
eviction from a crash; and it records an Event on the pod (``kubectl describe pod``, ``kubectl
get events``) naming the cause, the owner, the card and the node. A refused or failed eviction
gets a Warning Event. The admission policies ``gpushare-solver-own-node`` (the condition) and
``gpushare-solver-events`` (the Events) allow exactly these shapes: the reasons of
:data:`REASONS` and :data:`WARNINGS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpushare_common.ids import IdError, parse_pod_key, parse_spot_device_id
from gpushare_common.kubeevents import pod_event, rfc3339

from .cards import CARD_GONE, RESERVED_REASON
from .pressure import PRESSURE
from .share import SHADOW_GONE
from .spot import OWNER_BACK

DISRUPTION_TARGET = "DisruptionTarget"
COMPONENT = "gpushare-solver"

# a reclaim's reason -> the Kubernetes reason (condition and Event) and what it says
_CAUSES = {
    OWNER_BACK: ("OwnerReturned", "the owner {owner} of the card {cards} came back"),
    SHADOW_GONE: ("ShadowPodGone", "its ShadowPod {owner}, holding the card {cards}, is gone"),
    RESERVED_REASON: ("CardReserved", "the card {cards} is now held by {owner}"),
    CARD_GONE: ("CardGone", "the card {cards} is no longer on the node"),
}
_PRESSURE = {"memory": "MemoryPressure", "cpu": "CPUPressure"}
OTHER = "EvictedByGpushare"  # a reason of a newer solver's plan that this one does not know
EVICTION_REFUSED = "EvictionRefused"
EVICTION_FAILED = "EvictionFailed"
REASONS = tuple(sorted({r for r, _ in _CAUSES.values()} | set(_PRESSURE.values()) | {OTHER}))
WARNINGS = (EVICTION_FAILED, EVICTION_REFUSED)


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why gpushare evicted a pod: a Kubernetes reason and a sentence."""

    reason: str
    message: str


def cards_of(devices: tuple[str, ...], cards: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The real cards behind a victim's devices: ``cards`` when known, else its spot devices'."""
    if cards:
        return cards
    found = []
    for device in devices:
        try:
            found.append(parse_spot_device_id(device))
        except IdError:
            continue
    return tuple(found)


def explain(reason: str, owner: str, cards: tuple[str, ...], node: str,
            over: tuple[str, ...] = ()) -> Explanation:
    """The Kubernetes reason and message of an eviction for ``reason`` (a reclaim's)."""
    if reason == PRESSURE:
        resources = [r for r in ("memory", "cpu") if r in over] or ["memory"]
        said = " and ".join("CPU" if r == "cpu" else r for r in resources)
        return Explanation(_PRESSURE[resources[0]],
                           f"gpushare evicted this oversold pod: node {node} is short of {said}")
    kubernetes_reason, says = _CAUSES.get(reason, (OTHER, f"{reason} (owner {{owner}}, card {{cards}})"))
    named = ", ".join(cards) or "?"
    return Explanation(kubernetes_reason,
                       f"gpushare evicted this pod from node {node}: " + says.format(owner=owner or "?", cards=named))


def condition(explanation: Explanation, at: float | None = None) -> dict[str, Any]:
    """The pod's ``DisruptionTarget`` condition, as the kubelet sets it before a deletion."""
    return {"type": DISRUPTION_TARGET, "status": "True", "reason": explanation.reason,
            "message": explanation.message, "lastTransitionTime": rfc3339(at)}


def event(pod: str, uid: str, reason: str, message: str, node: str, warning: bool = False) -> dict[str, Any]:
    """A core/v1 Event on ``pod`` (``ns/name``) from this node's solver."""
    namespace, name = parse_pod_key(pod)
    return pod_event(namespace, name, uid=uid, reason=reason, message=message, warning=warning,
                     component=COMPONENT, instance=node, host=node)


def refused_message(why: str, reason: str, owner: str, node: str) -> str:
    return (f"gpushare's solver on node {node} refused to evict this pod ({reason}, owner {owner or '?'}): {why}; "
            "it was neither killed nor deleted")


def failed_message(step: str, error: str, reason: str, owner: str, node: str) -> str:
    return (f"gpushare's solver on node {node} could not {step} this pod ({reason}, owner {owner or '?'}): "
            f"{error}; it tries again")
