"""Share plugins: N virtual devices per Running ShadowPod of their spec on this node."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from gpushare_common import ids
from gpushare_common.isolation import SOFT_SHARE_LABEL, ShareCaps, format_share_caps
from gpushare_common.logging import get_logger
from gpushare_common.pods import SHARE_KINDS, PodError, PodKind, PodRules, read_pod

from ..devices import HEALTHY, UNHEALTHY, Health
from ..errors import invalid, not_found
from .base import Annotations, PluginLogic, PreferredRequest, Signer

log = get_logger("deviceplugin.share")


@dataclass(frozen=True, slots=True)
class ShadowPodView:
    """What a share plugin needs to know of one ShadowPod on this node."""

    namespace: str
    name: str
    kind: str  # share | share-dev
    spec: int
    container: str = ids.SHADOW_CONTAINER
    terminating: bool = False
    vendor_resource: str = ""  # the card it holds (its GPU container's extended resource)
    isolation: str = ""  # its isolation profile (annotation gpushare.k8s.io/isolation), "" for none

    @property
    def key(self) -> str:
        return ids.pod_key(self.namespace, self.name)

    def resource_token(self) -> str:
        return f"{SHARE_KINDS.get(self.kind, self.kind)}-{self.spec}"


def share_resource_token(kind: str, spec: int) -> str:
    return f"{SHARE_KINDS[kind]}-{spec}"


class ShareLogic(PluginLogic):
    """``<domain>/share-gpu-<N>`` or ``<domain>/share-dev-gpu-<N>``."""

    kind = "share"

    def __init__(self, resource: str, spec: int, signer: Signer, policy: str = "packed",
                 card_memory_mib: dict[str, int] | None = None, opt_out: bool = False) -> None:
        super().__init__(resource)
        self.spec = spec
        self.policy = policy
        self._signer = signer
        self.shadows: dict[str, ShadowPodView] = {}
        self.card_memory_mib = dict(card_memory_mib or {})  # per vendor resource
        self.opt_out = opt_out  # whether a SharePod of this kind may opt out of its caps

    def replace_shadows(self, shadows: list[ShadowPodView]) -> None:
        self.shadows = {s.key: s for s in shadows}
        self.refresh()

    def compute(self) -> dict[str, Health]:
        devices: dict[str, Health] = {}
        for shadow in self.shadows.values():
            base: Health = UNHEALTHY if shadow.terminating else HEALTHY
            for device_id in ids.share_device_ids(shadow.namespace, shadow.name, self.spec):
                devices[device_id] = base if base == UNHEALTHY else self.desired.get(
                    device_id, HEALTHY
                )
        return devices

    def _allocate(self, device_ids: list[str]) -> Annotations:
        sources: dict[str, dict[str, list[str]]] = {}
        shadows: dict[str, ShadowPodView] = {}
        for device_id in device_ids:
            shadow = self._shadow_of(device_id)
            shadows[shadow.key] = shadow
            source = f"{shadow.namespace}/{shadow.name}/{shadow.container}"
            sources.setdefault(source, {ids.ALL_RESOURCES: []})[ids.ALL_RESOURCES].append(device_id)
        annotations = self._signer.annotations(ids.KIND_FROM, ids.format_devices_from(sources))
        capped = sorted(k for k, s in shadows.items() if s.isolation)
        if capped:
            annotations.update(self._caps(shadows, capped, len(device_ids)))
        return annotations

    def _caps(self, shadows: dict[str, ShadowPodView], capped: list[str], held: int) -> Annotations:
        """The signed caps of a share of one capped ShadowPod (its daemon serves one card)."""
        if len(shadows) > 1:
            raise invalid(self.resource, f"devices of capped ShadowPods ({', '.join(capped)}) cannot "
                          f"be combined with others: this request spans {', '.join(sorted(shadows))}")
        shadow = shadows[capped[0]]
        if not shadow.vendor_resource:
            raise invalid(self.resource, f"ShadowPod {shadow.key} is capped but requests no card")
        caps = ShareCaps(shadow.isolation, shadow.vendor_resource, shadow.key, self.spec, held,
                         self.card_memory_mib.get(shadow.vendor_resource), self.opt_out)
        return self._signer.annotations(ids.KIND_ISOLATION, format_share_caps(caps))

    def _shadow_of(self, device_id: str) -> ShadowPodView:
        try:
            parsed = ids.parse_share_device_id(device_id)
        except ids.IdError as err:
            raise invalid(self.resource, str(err)) from None
        shadow = self.shadows.get(parsed.shadow_key)
        if shadow is None or parsed.index >= self.spec:
            raise not_found(self.resource, f"device {device_id!r} has no Running ShadowPod")
        return shadow

    def check_known(self, device_id: str) -> None:
        self._shadow_of(device_id)
        super().check_known(device_id)

    def _choose(self, candidates: list[str], request: PreferredRequest) -> list[str]:
        chosen = list(request.must_include)
        free = self._group_by_shadow(candidates)
        while len(chosen) < request.size:
            wanted = request.size - len(chosen)
            key = _pick_shadow(free, self.policy, wanted)
            take = 1 if self.policy == "spread" else wanted  # packed: fill one ShadowPod
            chosen.extend(free[key][:take])
            free[key] = free[key][take:]
            if not free[key]:
                del free[key]
        return chosen

    def status(self) -> dict[str, Any]:
        isolation = {k: s.isolation or SOFT_SHARE_LABEL for k, s in sorted(self.shadows.items())}
        return {**super().status(), "spec": self.spec, "shadow_pods": sorted(self.shadows),
                "isolation": isolation}


    def _group_by_shadow(self, device_ids: list[str]) -> dict[str, list[str]]:
        groups: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for device_id in device_ids:
            try:
                parsed = ids.parse_share_device_id(device_id)
            except ids.IdError as err:
                raise invalid(self.resource, str(err)) from None
            groups[parsed.shadow_key].append((parsed.index, device_id))
        return {key: [d for _, d in sorted(items)] for key, items in groups.items()}


def _pick_shadow(free: dict[str, list[str]], policy: str, wanted: int) -> str:
    """Packed: among ShadowPods that can hold the rest of the request, the one with the
    fewest free devices (else the one with the most, to span fewer cards); spread: the
    one with the most free devices. Ties by name."""
    if policy == "spread":
        return min(free, key=lambda k: (-len(free[k]), k))
    return min(free, key=lambda k: (0, len(free[k]), k) if len(free[k]) >= wanted
               else (1, -len(free[k]), k))


def shadow_view(pod: dict[str, Any], rules: PodRules) -> ShadowPodView | None:
    """A Running ShadowPod as a :class:`ShadowPodView`; None for anything else (a pod that is
    not the platform's ShadowPod, or one that does not read; the reason is logged).

    A capped ShadowPod (annotation ``gpushare.k8s.io/isolation``) counts only once Ready:
    its readiness includes its isolation daemon being up.
    """
    try:
        view = read_pod(pod, rules)
    except PodError as err:
        log.warning("ShadowPod not readable; ignored", pod=err.pod, reason=err.reason)
        return None
    if view.kind is not PodKind.SHADOW or view.share is None or view.phase != "Running":
        return None
    meta, spec, status = (_object(pod, k) for k in ("metadata", "spec", "status"))
    isolation = str(_object(meta, "annotations").get(ids.ANN_ISOLATION, ""))
    if isolation and not _ready(status):
        return None
    containers = spec.get("containers")
    containers = [c for c in containers if isinstance(c, dict)] if isinstance(containers, list) else []
    container = gpu_container(containers)
    return ShadowPodView(view.namespace, view.name, view.share.kind, view.share.count, container,
                         terminating=view.terminating, vendor_resource=_card_resource(containers, container),
                         isolation=isolation)  # fmt: skip


def _ready(status: dict[str, Any]) -> bool:
    conditions = status.get("conditions")
    return isinstance(conditions, list) and any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in conditions)


def _card_resource(containers: list[dict[str, Any]], name: str) -> str:
    """The extended resource (the card) the GPU container limits, "" if none."""
    for container in containers:
        if container.get("name", ids.SHADOW_CONTAINER) == name:
            limits = _object(_object(container, "resources"), "limits")
            cards = sorted(str(r) for r in limits if _is_extended(str(r)))
            return cards[0] if cards else ""
    return ""


def _object(doc: object, key: str) -> dict[str, Any]:
    """``doc[key]`` when both are JSON objects, else an empty one."""
    value = doc.get(key) if isinstance(doc, dict) else None
    return value if isinstance(value, dict) else {}


_PLAIN_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})


def _is_extended(name: str) -> bool:
    return name not in _PLAIN_RESOURCES and not name.startswith("hugepages-")


def gpu_container(containers: list[dict[str, Any]]) -> str:
    """The container holding the card: the first one limiting an extended resource,
    else ``main``, else the first one."""
    containers = [c for c in containers if isinstance(c, dict)]
    for container in containers:
        limits = _object(_object(container, "resources"), "limits")
        if any(_is_extended(str(name)) for name in limits):
            return str(container.get("name") or ids.SHADOW_CONTAINER)
    names = [str(c.get("name", "")) for c in containers]
    return ids.SHADOW_CONTAINER if ids.SHADOW_CONTAINER in names or not names else names[0]
