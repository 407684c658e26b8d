"""Rebuild the MappingCache from the node's pods when its bucket is empty (SPEC section 5).

What the pod objects tell, and so what is rebuilt here:

- ShadowPods (label ``pod-description=shadow-pod``, Running, annotations
  ``share-spec`` and ``share-kind``): the owner and its N virtual devices,
  resource ``share-gpu-<N>`` or ``share-dev-gpu-<N>``; terminating when the pod
  has a deletion timestamp.
- Their SharePods: the ShadowPod's ``Using`` condition (written by the solver)
  names the device of each user; a user is kept when it is a pod of the node,
  not finished, whose ``device-owner`` annotation names that ShadowPod or is
  not written yet.
- Borrowers: a pod requesting ``spot-gpu`` whose annotations carry the Allocate
  annotation ``container-devices-ids.<target>`` with a valid signature (node
  key configured): its ``spot-<id>`` devices go to ``idle-space``, used by it.

What they do not tell (the kubelet's allocation, GPU activity), left to the
detector's events (its start and every resync republish them): the real cards
of ShadowPods and reserved pods (so reserved owners), whether an owner is
away, which virtual device a SharePod holds when only its ``device-owner``
annotation names the ShadowPod, the card inventory, and borrowers whose pod
carries no signed Allocate annotation. Desired health is not derived here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gpushare_common.ids import (
    ANN_DEVICE_OWNER,
    ANN_DEVICES_IDS,
    ANN_SHARE_KIND,
    ANN_SHARE_SPEC,
    CONDITION_USING,
    KIND_IDS,
    LABEL_POD_DESCRIPTION,
    SHADOW_POD_LABEL_VALUE,
    IdError,
    parse_devices_ids,
    share_device_ids,
    signature_annotation,
    spot_device_id,
    verify,
)
from gpushare_common.mapping import IDLE_SPACE, MappingError

from .actions import Action, DeviceList
from .state import SHADOW, SolverState

Obj = dict[str, Any]
SHARE_RESOURCES = {"share": "share-gpu", "share-dev": "share-dev-gpu"}


@dataclass
class Rebuilt:
    """What a rebuild found, for one log line."""

    shadow_pods: int = 0
    users: int = 0
    borrowers: int = 0
    unknown_holders: int = 0  # pods that may hold real cards (which ones, pods do not tell)
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def _meta(pod: Obj) -> Obj:
    meta = pod.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _strings(pod: Obj, key: str) -> dict[str, str]:
    found = _meta(pod).get(key)
    return {k: v for k, v in found.items() if isinstance(v, str)} if isinstance(found, dict) else {}


def _key(pod: Obj) -> str:
    return f"{_meta(pod).get('namespace', '')}/{_meta(pod).get('name', '')}"


def _phase(pod: Obj) -> str:
    status = pod.get("status")
    return str(status.get("phase") or "") if isinstance(status, dict) else ""


def _shadow_spec(pod: Obj) -> tuple[str, int] | None:
    """(share resource, N) of a Running ShadowPod; None for any other pod or bad annotations."""
    if _strings(pod, "labels").get(LABEL_POD_DESCRIPTION) != SHADOW_POD_LABEL_VALUE or _phase(pod) != "Running":
        return None
    annotations = _strings(pod, "annotations")
    kind, spec = annotations.get(ANN_SHARE_KIND, "share"), annotations.get(ANN_SHARE_SPEC, "")
    if kind not in SHARE_RESOURCES or not spec.isdigit() or not 1 <= int(spec) <= 1024:
        raise ValueError(f"bad {ANN_SHARE_KIND}={kind!r} or {ANN_SHARE_SPEC}={spec!r}")
    return f"{SHARE_RESOURCES[kind]}-{int(spec)}", int(spec)


def _using(pod: Obj) -> dict[str, str]:
    """The ``Using`` condition's users: virtual device -> SharePod."""
    status = pod.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for condition in conditions if isinstance(conditions, list) else []:
        if isinstance(condition, dict) and condition.get("type") == CONDITION_USING:
            users = json.loads(str(condition.get("message") or "{}"))
            if not isinstance(users, dict) or not all(isinstance(u, str) for u in users.values()):
                raise ValueError("Using condition message is not a JSON object of pod keys")
            return {str(d): u for d, u in users.items()}
    return {}


def _rebuild_shadow(pod: Obj, live: dict[str, Obj], state: SolverState, found: Rebuilt) -> str:
    """The ShadowPod's owner and users; its share resource ("" when the pod is not a ShadowPod)."""
    try:
        spec = _shadow_spec(pod)
        if spec is None:
            return ""
        users = _using(pod)
        namespace, name = _key(pod).split("/", 1)
        devices = share_device_ids(namespace, name, spec[1])
    except (ValueError, IdError):
        found.skip("malformed-shadow-pod")
        return ""
    shadow = _key(pod)
    state.cache.create(shadow, devices, kind=SHADOW, resource=spec[0])
    if _meta(pod).get("deletionTimestamp"):
        state.terminating.add(shadow)
    found.shadow_pods += 1
    for device, user in sorted(users.items()):
        owner = _strings(live.get(user, {}), "annotations").get(ANN_DEVICE_OWNER, shadow)
        if user not in live or owner != shadow:
            found.skip("user-not-on-node" if user not in live else "user-of-another-shadow-pod")
            continue
        try:
            found.users += state.cache.use(shadow, user, device)
        except MappingError:
            found.skip("user-device-unknown")
    return spec[0]


def _resources(pod: Obj) -> set[str]:
    """Every resource name any container of the pod requests or limits."""
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, dict) else None
    names: set[str] = set()
    for container in containers if isinstance(containers, list) else []:
        resources = container.get("resources") if isinstance(container, dict) else None
        for kind in ("requests", "limits"):
            named = resources.get(kind) if isinstance(resources, dict) else None
            if isinstance(named, dict):
                names.update(str(n) for n in named)
    return names


def _requests_spot(pod: Obj, resource: str) -> bool:
    return any(n.rsplit("/", 1)[-1] == resource for n in _resources(pod))


def _may_hold_cards(pod: Obj, spot_resource: str) -> bool:
    """Whether the pod requests an extended resource that is not one of gpushare's own (a
    vendor's card, say): the kubelet alone knows which devices it got."""
    for name in _resources(pod):
        domain, _, token = name.rpartition("/")
        if domain and not (token == spot_resource or token.startswith("share-") or token in ("vcpu", "vmem")):
            return True
    return False


def _signed_spot_devices(pod: Obj, key: bytes) -> list[str]:
    """The spot devices of every signed ``container-devices-ids`` annotation; ValueError if unsigned."""
    annotations = _strings(pod, "annotations")
    devices: list[str] = []
    for name, value in sorted(annotations.items()):
        if not name.startswith(ANN_DEVICES_IDS):
            continue
        target = name[len(ANN_DEVICES_IDS):]
        node = str((pod.get("spec") or {}).get("nodeName") or "")  # the node whose key signed it
        signature = annotations.get(signature_annotation(KIND_IDS, target))
        if not verify(key, KIND_IDS, node, target, value, signature):
            raise ValueError(f"{name}: missing or wrong signature")
        request = parse_devices_ids(target, value)
        devices += [spot_device_id(card) for _, cards in request.devices for card in cards]
    return list(dict.fromkeys(devices))


def _rebuild_borrower(pod: Obj, state: SolverState, key: bytes | None, found: Rebuilt) -> None:
    if not _requests_spot(pod, state.spot_resource):
        return
    try:
        devices = _signed_spot_devices(pod, key) if key is not None else []
    except (ValueError, IdError):
        found.skip("unsigned-or-malformed-allocate-annotation")
        return
    if not devices:
        found.skip("borrower-without-allocate-annotation")
        return
    state.lend(devices)
    for device in devices:
        try:
            state.cache.use(IDLE_SPACE, _key(pod), device)
        except MappingError:
            found.skip("spot-device-claimed-twice")
    found.borrowers += 1


def rebuild(state: SolverState, pods: list[Obj], key: bytes | None) -> tuple[list[Action], Rebuilt]:
    """Fill an empty cache from the node's pods; the share resources' device lists to publish."""
    found = Rebuilt()
    live = {_key(p): p for p in pods if _phase(p) not in ("Succeeded", "Failed")}
    resources: set[str] = set()
    for pod in live.values():
        found.unknown_holders += _may_hold_cards(pod, state.spot_resource)
        if resource := _rebuild_shadow(pod, live, state, found):
            resources.add(resource)
        else:
            _rebuild_borrower(pod, state, key, found)
    actions: list[Action] = [DeviceList(resource=r, devices=state.devices_of_resource(r),
                                        reason="rebuilt from the cluster") for r in sorted(resources)]
    return actions, found
