"""What kind of pod this is, read from its labels, annotations and resource requests.

- ShadowPod: label ``gpushare.k8s.io/pod-description=shadow-pod``;
- SharePod: a container requests ``<domain>/share-*``;
- spot pod: a container requests ``<domain>/spot-gpu``;
- reserved GPU pod: a container requests a vendor GPU resource (and it is not
  a ShadowPod); it is a *lendable* dev machine when the configured label or
  annotation has the configured value;
- batch pod: a container requests ``<domain>/vcpu`` or ``<domain>/vmem``;
- anything else is an ordinary pod (it only matters for spare capacity).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpushare_common import ids

Pod = Mapping[str, Any]
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
SHARE_KINDS = {"share": "share-gpu", "share-dev": "share-dev-gpu"}


class PodClass(StrEnum):
    SHADOW = "shadow"
    SHARE = "share"
    SPOT = "spot"
    RESERVED = "reserved"
    BATCH = "batch"
    ORDINARY = "ordinary"


class ClassifyError(ValueError):
    """A pod object the detector cannot read: which pod and what is wrong."""

    def __init__(self, pod: str, reason: str) -> None:
        self.pod = pod
        self.reason = reason
        super().__init__(f"pod {pod}: {reason}")


@dataclass(frozen=True, slots=True)
class Rules:
    domain: str = "gpushare"
    vendor_resources: tuple[str, ...] = ("nvidia.com/gpu",)
    lendable_key: str = "gpushare.k8s.io/lendable"
    lendable_value: str = "true"

    @property
    def spot_resource(self) -> str:
        return f"{self.domain}/spot-gpu"

    def is_share(self, resource: str) -> bool:
        return resource.startswith(f"{self.domain}/share-")

    def is_batch(self, resource: str) -> bool:
        return resource in (f"{self.domain}/vcpu", f"{self.domain}/vmem")


@dataclass(frozen=True, slots=True)
class ShareSpec:
    kind: str  # share | share-dev
    count: int

    @property
    def resource(self) -> str:
        return f"{SHARE_KINDS[self.kind]}-{self.count}"


@dataclass(frozen=True, slots=True)
class PodView:
    """The few facts about a pod the detector acts on."""

    key: str  # <namespace>/<name>
    uid: str
    cls: PodClass
    phase: str = ""
    terminating: bool = False
    lendable: bool = False
    priority: int = 0
    containers: Mapping[str, tuple[str, ...]] = ()  # type: ignore[assignment]
    share: ShareSpec | None = None

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES

    def requesting(self, predicate: Any) -> dict[str, tuple[str, ...]]:
        """Containers with the resources they request that satisfy ``predicate``."""
        found = {c: tuple(r for r in rs if predicate(r)) for c, rs in self.containers.items()}
        return {c: rs for c, rs in found.items() if rs}


def _mapping(key: str, value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ClassifyError(key, f"{where} must be an object, not {type(value).__name__}")
    return value


def _strings(key: str, value: Any, where: str) -> Mapping[str, str]:
    found = _mapping(key, value, where)
    if not all(isinstance(v, str) for v in found.values()):
        raise ClassifyError(key, f"{where} values must be strings")
    return found


def _requests(key: str, container: Mapping[str, Any]) -> tuple[str, ...]:
    resources = _mapping(key, container.get("resources"), "container resources")
    limits = _mapping(key, resources.get("limits"), "resources.limits")
    requests = _mapping(key, resources.get("requests"), "resources.requests")
    return tuple(sorted({str(n) for n in (*limits, *requests)}))


def _identity(pod: Pod) -> str:
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        raise ClassifyError("?", "no metadata")
    namespace, name = meta.get("namespace"), meta.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str) or not namespace or not name:
        raise ClassifyError("?", "metadata.namespace and metadata.name must be non-empty strings")
    return f"{namespace}/{name}"


def _containers(pod: Pod, key: str) -> dict[str, tuple[str, ...]]:
    spec = _mapping(key, pod.get("spec"), "spec")
    if not isinstance(spec.get("containers") or [], list):
        raise ClassifyError(key, "spec.containers must be a list")
    result: dict[str, tuple[str, ...]] = {}
    for container in spec.get("containers") or []:
        if not isinstance(container, Mapping) or not isinstance(container.get("name"), str):
            raise ClassifyError(key, "every container needs a name")
        result[container["name"]] = _requests(key, container)
    return result


def share_spec(key: str, annotations: Mapping[str, str]) -> ShareSpec:
    kind = annotations.get(ids.ANN_SHARE_KIND, "share")
    raw = annotations.get(ids.ANN_SHARE_SPEC, "")
    if kind not in SHARE_KINDS:
        raise ClassifyError(key, f"{ids.ANN_SHARE_KIND}={kind!r}: expected share or share-dev")
    if not raw.isdigit() or not 1 <= int(raw) <= 1024:
        raise ClassifyError(key, f"{ids.ANN_SHARE_SPEC}={raw!r}: expected an integer 1..1024")
    return ShareSpec(kind, int(raw))


def _class_of(rules: Rules, labels: Mapping[str, str], requested: set[str]) -> PodClass:
    if labels.get(ids.LABEL_POD_DESCRIPTION) == ids.SHADOW_POD_LABEL_VALUE:
        return PodClass.SHADOW
    if any(rules.is_share(r) for r in requested):
        return PodClass.SHARE
    if rules.spot_resource in requested:
        return PodClass.SPOT
    if requested & set(rules.vendor_resources):
        return PodClass.RESERVED
    if any(rules.is_batch(r) for r in requested):
        return PodClass.BATCH
    return PodClass.ORDINARY


def _lendable(rules: Rules, labels: Mapping[str, str], annotations: Mapping[str, str]) -> bool:
    return rules.lendable_value in (labels.get(rules.lendable_key), annotations.get(rules.lendable_key))


def classify(pod: Pod, rules: Rules) -> PodView:
    """Read one pod (the API's JSON shape); :class:`ClassifyError` when it is malformed."""
    key = _identity(pod)
    meta = pod["metadata"]
    containers = _containers(pod, key)
    labels = _strings(key, meta.get("labels"), "metadata.labels")
    annotations = _strings(key, meta.get("annotations"), "metadata.annotations")
    cls = _class_of(rules, labels, {r for rs in containers.values() for r in rs})
    status = _mapping(key, pod.get("status"), "status")
    priority = _mapping(key, pod.get("spec"), "spec").get("priority") or 0
    if not isinstance(priority, int):
        raise ClassifyError(key, f"spec.priority must be an integer, not {priority!r}")
    return PodView(
        key=key,
        uid=str(meta.get("uid") or ""),
        cls=cls,
        phase=str(status.get("phase") or ""),
        terminating=bool(meta.get("deletionTimestamp")),
        lendable=cls is PodClass.RESERVED and _lendable(rules, labels, annotations),
        priority=priority,
        containers=containers,
        share=share_spec(key, annotations) if cls is PodClass.SHADOW else None,
    )
