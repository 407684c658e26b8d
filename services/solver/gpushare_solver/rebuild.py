"""Rebuild the MappingCache from the node's pods when its bucket is empty.

See docs/state-machines.md, 'Solver card states'.

What the pod objects tell, and so what is rebuilt here:

- ShadowPods (as :mod:`gpushare_common.pods` reads them: the platform's own, in the system
  namespace; Running): the owner and its N virtual devices, resource ``share-gpu-<N>`` or
  ``share-dev-gpu-<N>``; terminating when the pod has a deletion timestamp.
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

from dataclasses import dataclass, field

from gpushare_common.ids import (
    ANN_DEVICES_IDS,
    KIND_IDS,
    IdError,
    parse_devices_ids,
    share_device_ids,
    spot_device_id,
    verify,
)
from gpushare_common.mapping import IDLE_SPACE, MappingError
from gpushare_common.pods import Pod, PodKind

from .actions import Action, DeviceList
from .nodepods import NodePods
from .state import SHADOW, SolverState


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


def _rebuild_shadow(view: Pod, live: dict[str, Pod], state: SolverState, found: Rebuilt) -> str:
    """The ShadowPod's owner and users; its share resource ("" when the pod is not a ShadowPod)."""
    if view.kind is not PodKind.SHADOW or view.share is None or view.phase != "Running":
        return ""
    shadow = view.key
    state.cache.create(shadow, share_device_ids(view.namespace, view.name, view.share.count), kind=SHADOW,
                       resource=view.share.resource)  # fmt: skip
    if view.terminating:
        state.terminating.add(shadow)
    found.shadow_pods += 1
    for device, user in sorted(view.using.items()):
        sharer = live.get(user)
        if sharer is None or (sharer.device_owner or shadow) != shadow:
            found.skip("user-not-on-node" if sharer is None else "user-of-another-shadow-pod")
            continue
        try:
            found.users += state.cache.use(shadow, user, device)
        except MappingError:
            found.skip("user-device-unknown")
    return view.share.resource


def _requests_spot(view: Pod, resource: str) -> bool:
    return any(n.rsplit("/", 1)[-1] == resource for n in view.resources)


def _may_hold_cards(view: Pod, spot_resource: str) -> bool:
    """Whether the pod requests an extended resource that is not one of gpushare's own (a
    vendor's card, say): the kubelet alone knows which devices it got."""
    for name in view.resources:
        domain, _, token = name.rpartition("/")
        if domain and not (token == spot_resource or token.startswith("share-") or token in ("vcpu", "vmem")):
            return True
    return False


def _signed_spot_devices(view: Pod, key: bytes) -> list[str]:
    """The spot devices of every signed ``container-devices-ids`` annotation; ValueError if unsigned."""
    devices: list[str] = []
    for target, annotation in view.devices_ids.items():  # signed with the key of the pod's node
        if not verify(key, KIND_IDS, view.node, target, annotation.value, annotation.signature):
            raise ValueError(f"{ANN_DEVICES_IDS}{target}: missing or wrong signature")
        request = parse_devices_ids(target, annotation.value)
        devices += [spot_device_id(card) for _, cards in request.devices for card in cards]
    return list(dict.fromkeys(devices))


def _rebuild_borrower(view: Pod, state: SolverState, key: bytes | None, found: Rebuilt) -> None:
    if not _requests_spot(view, state.spot_resource):
        return
    try:
        devices = _signed_spot_devices(view, key) if key is not None else []
    except (ValueError, IdError):
        found.skip("unsigned-or-malformed-allocate-annotation")
        return
    if not devices:
        found.skip("borrower-without-allocate-annotation")
        return
    state.lend(devices)
    for device in devices:
        try:
            state.cache.use(IDLE_SPACE, view.key, device)
        except MappingError:
            found.skip("spot-device-claimed-twice")
    found.borrowers += 1


def rebuild(state: SolverState, pods: NodePods, key: bytes | None) -> tuple[list[Action], Rebuilt]:
    """Fill an empty cache from the node's pods; the share resources' device lists to publish."""
    found = Rebuilt()
    for _ in pods.malformed:
        found.skip("malformed-pod")
    for view in pods.pods:
        if view.forged_shadow:
            found.skip("forged-shadow-pod")
    live = {view.key: view for view in pods.pods if not view.finished}
    resources: set[str] = set()
    for view in live.values():
        found.unknown_holders += _may_hold_cards(view, state.spot_resource)
        if resource := _rebuild_shadow(view, live, state, found):
            resources.add(resource)
        else:
            _rebuild_borrower(view, state, key, found)
    actions: list[Action] = [DeviceList(resource=r, devices=state.devices_of_resource(r),
                                        reason="rebuilt from the cluster") for r in sorted(resources)]
    return actions, found
