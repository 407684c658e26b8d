"""One typed view of a pod, read once with one set of rules, for every service (docs/pods.md).

:func:`read_pod` turns the API's JSON form of a pod into a :class:`Pod`: who it is, where it
runs, what it requests, and what gpushare makes of it (its :class:`PodKind`, a ShadowPod's
share spec, a SharePod's device owner, the ``Using`` condition). A malformed pod is a
:class:`PodError` naming the pod and the field.

A **ShadowPod** is a pod of the platform: it carries the ShadowPod label *and* the
shadow-controller's ``managed-by`` label, *and* lives in the system namespace (which tenants
cannot create pods in: RBAC and the admission policies in ``k8s/``). A pod that carries the
ShadowPod label anywhere else is not a ShadowPod; it is read as what it requests, with
``forged_shadow`` set, so a service can count and log the attempt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import msgspec

from . import dra, ids
from .quantity import QuantityError, parse_count

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
SHARE_KINDS = {"share": "share-gpu", "share-dev": "share-dev-gpu"}  # share kind -> resource stem
MANAGED_BY = "app.kubernetes.io/managed-by"
SHADOW_CONTROLLER = "gpushare-shadow-controller"
SYSTEM_NAMESPACE = "gpushare-system"
MAX_SHARE = 1024


class PodKind(StrEnum):
    SHADOW = "shadow"  # holds a real card for SharePods
    SHARE = "share"  # uses a ShadowPod's virtual devices
    SPOT = "spot"  # borrows an idle card
    RESERVED = "reserved"  # holds real cards (a lendable dev machine is one)
    BATCH = "batch"  # oversold CPU/memory
    ORDINARY = "ordinary"


UNKNOWN = "?"  # the pod of a PodError raised before its namespace and name were read


class PodError(ValueError):
    """A pod object that cannot be read: which pod (its key, or ``UNKNOWN``) and what is wrong."""

    def __init__(self, pod: str, reason: str) -> None:
        self.pod = pod
        self.reason = reason
        super().__init__(f"pod {pod}: {reason}")


class ShareSpec(msgspec.Struct, frozen=True):
    kind: str  # share | share-dev
    count: int  # N virtual devices per ShadowPod

    @property
    def resource(self) -> str:
        """The resource name without its domain: ``share-gpu-4``."""
        return f"{SHARE_KINDS[self.kind]}-{self.count}"


def parse_share_resource(resource: str, domain: str) -> ShareSpec | None:
    """``<domain>/share-gpu-4`` -> ShareSpec("share", 4); None for any other resource."""
    stem, _, count = resource.removeprefix(f"{domain}/").rpartition("-")
    kind = next((k for k, s in SHARE_KINDS.items() if s == stem), None)
    if not resource.startswith(f"{domain}/") or kind is None or not count.isdigit() or count.startswith("0"):
        return None
    return ShareSpec(kind, int(count)) if 1 <= int(count) <= MAX_SHARE else None


class SignedAnnotation(msgspec.Struct, frozen=True):
    """An annotation's value as written, with its signature annotation ("" when there is none)."""

    value: str
    signature: str = ""


class PodRules(msgspec.Struct, frozen=True, kw_only=True):
    domain: str = "gpushare"
    vendor_resources: tuple[str, ...] = ("nvidia.com/gpu",)
    lendable_key: str = "gpushare.k8s.io/lendable"
    lendable_value: str = "true"
    system_namespace: str = SYSTEM_NAMESPACE

    @property
    def spot_resource(self) -> str:
        return f"{self.domain}/spot-gpu"

    def is_share(self, resource: str) -> bool:
        return parse_share_resource(resource, self.domain) is not None

    def is_batch(self, resource: str) -> bool:
        return resource in (f"{self.domain}/vcpu", f"{self.domain}/vmem")

    def claimed_devices(self, devices: Mapping[str, Mapping[str, tuple[str, ...]]]
                        ) -> dict[str, dict[str, tuple[str, ...]]]:
        """Per container (of pod-resources' answer for one pod), the CDI devices of gpushare's DRA
        claims read as the resources they stand for: a card of an ``exclusive`` claim is a card of
        the first vendor resource (its holder is a reserved pod, a lendable dev machine an owner),
        a ``spot`` claim's card its spot device (its holder a borrower); ``share`` claims hold no
        card of their own. Device-plugin resources are kept as they are."""
        found: dict[str, dict[str, tuple[str, ...]]] = {}
        for container, resources in devices.items():
            held = {r: found_ids for r, found_ids in resources.items() if r != dra.CDI_KIND}
            for name in resources.get(dra.CDI_KIND, ()):
                try:
                    device = dra.parse_cdi_device(name)
                except dra.DraNameError:
                    continue
                if device.role == dra.ROLE_SPOT:
                    held[self.spot_resource] = (*held.get(self.spot_resource, ()), ids.spot_device_id(device.card))
                elif device.role == dra.ROLE_EXCLUSIVE and self.vendor_resources:
                    vendor = self.vendor_resources[0]
                    held[vendor] = (*held.get(vendor, ()), device.card)
            found[container] = {r: tuple(sorted(set(v))) for r, v in held.items()}
        return found

    def spot_users(self, node: Mapping[str, Mapping[str, Mapping[str, tuple[str, ...]]]]
                   ) -> dict[str, tuple[str, ...]]:
        """Pod key -> the spot devices its containers were given (device plugin or DRA claim), from
        pod-resources' answer for the node."""
        found: dict[str, tuple[str, ...]] = {}
        for pod, containers in node.items():
            spot = {d for held in self.claimed_devices(containers).values() for d in held.get(self.spot_resource, ())}
            if spot:
                found[pod] = tuple(sorted(spot))
        return found


class Pod(msgspec.Struct, frozen=True, kw_only=True):
    namespace: str
    name: str
    uid: str = ""
    node: str = ""
    phase: str = ""
    terminating: bool = False
    created: str = ""
    priority: int = 0
    kind: PodKind = PodKind.ORDINARY
    lendable: bool = False  # a reserved pod whose owner lends its idle cards
    lendable_label: bool = False  # carries the lendable label or annotation (whatever it holds)
    forged_shadow: bool = False  # the ShadowPod label on a pod that is not one
    containers: dict[str, tuple[str, ...]] = {}  # container -> resources it requests
    container_ids: dict[str, str] = {}  # container -> runtime id (containerd://...) from its status
    share: ShareSpec | None = None  # a ShadowPod's spec, or the share a SharePod asks for
    share_devices: int = 0  # virtual devices a SharePod requests (its containers together)
    device_owner: str = ""  # a SharePod's gpushare.k8s.io/device-owner
    using: dict[str, str] = {}  # a ShadowPod's Using condition: virtual device -> SharePod
    isolation: str = ""  # gpushare.k8s.io/isolation: a ShadowPod's profile, a SharePod's opt-out
    conditions: dict[str, str] = {}  # condition type -> its status (True, False, Unknown)
    restarts: dict[str, int] = {}  # container -> restartCount from its status
    claims: dict[str, tuple[str, ...]] = {}  # container -> the pod's resource claims it uses (DRA)
    vcpu: int = 0  # <domain>/vcpu devices its containers request together
    vmem: int = 0  # <domain>/vmem devices its containers request together
    devices_ids: dict[str, SignedAnnotation] = {}  # target -> container-devices-ids.<target>, its signature

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def resources(self) -> frozenset[str]:
        """Every resource any of its containers requests or limits."""
        return frozenset(r for rs in self.containers.values() for r in rs)

    @property
    def ready(self) -> bool:
        """The pod's Ready condition is True (every container passes its readiness probe)."""
        return self.conditions.get("Ready") == "True"

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES

    @property
    def active(self) -> bool:
        """Bound to a node, not finished, not being deleted."""
        return bool(self.node) and not self.finished and not self.terminating

    def requesting(self, predicate: Any) -> dict[str, tuple[str, ...]]:
        """Containers with the resources they request that satisfy ``predicate``."""
        found = {c: tuple(r for r in rs if predicate(r)) for c, rs in self.containers.items()}
        return {c: rs for c, rs in found.items() if rs}


# --- reading ---------------------------------------------------------------------


def _mapping(key: str, value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PodError(key, f"{where} must be an object, not {type(value).__name__}")
    return value


def _strings(key: str, value: Any, where: str) -> Mapping[str, str]:
    found = _mapping(key, value, where)
    if not all(isinstance(v, str) for v in found.values()):
        raise PodError(key, f"{where} values must be strings")
    return found


def _identity(doc: Mapping[str, Any]) -> tuple[str, str]:
    meta = doc.get("metadata")
    if not isinstance(meta, Mapping):
        raise PodError(UNKNOWN, "no metadata")
    namespace, name = meta.get("namespace"), meta.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str) or not namespace or not name:
        raise PodError(UNKNOWN, "metadata.namespace and metadata.name must be non-empty strings")
    return namespace, name


def pod_key(doc: Mapping[str, Any]) -> str:
    """``namespace/name`` of a pod object (all a deleted pod needs); :class:`PodError` without them."""
    namespace, name = _identity(doc)
    return f"{namespace}/{name}"


def _requests(key: str, container: Mapping[str, Any]) -> tuple[str, ...]:
    resources = _mapping(key, container.get("resources"), "container resources")
    limits = _mapping(key, resources.get("limits"), "resources.limits")
    requests = _mapping(key, resources.get("requests"), "resources.requests")
    return tuple(sorted({str(n) for n in (*limits, *requests)}))


def _containers(key: str, spec: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    listed = spec.get("containers") or []
    if not isinstance(listed, list):
        raise PodError(key, "spec.containers must be a list")
    result: dict[str, tuple[str, ...]] = {}
    for container in listed:
        if not isinstance(container, Mapping) or not isinstance(container.get("name"), str):
            raise PodError(key, "every container needs a name")
        result[container["name"]] = _requests(key, container)
    return result


def _claims(key: str, spec: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """Containers that use the pod's resource claims (``resources.claims[].name``)."""
    found: dict[str, tuple[str, ...]] = {}
    for container in spec.get("containers") or []:
        resources = container.get("resources") if isinstance(container, Mapping) else None
        claims = resources.get("claims") if isinstance(resources, Mapping) else None
        if claims is None:
            continue
        if not isinstance(claims, list) or not all(isinstance(c, Mapping) and isinstance(c.get("name"), str)
                                                   for c in claims):
            raise PodError(key, "resources.claims must be a list of {name}")
        if claims:
            found[str(container["name"])] = tuple(sorted({str(c["name"]) for c in claims}))
    return found


def _batch(key: str, spec: Mapping[str, Any], rules: PodRules) -> tuple[int, int]:
    """The ``<domain>/vcpu`` and ``<domain>/vmem`` devices the containers request together
    (``resources.requests``, the shapes checked by :func:`_containers`): each a whole number."""
    totals = {"vcpu": 0, "vmem": 0}
    for container in spec.get("containers") or []:
        requests = (container.get("resources") or {}).get("requests") or {}
        for resource in totals:
            name = f"{rules.domain}/{resource}"
            if name in requests:
                totals[resource] += _devices(key, name, requests[name], minimum=0)
    return totals["vcpu"], totals["vmem"]


def _devices(key: str, resource: str, value: Any, minimum: int) -> int:
    """How many devices of an extended resource a container asks for: a quantity whose value is a
    whole number (``3``, ``1k``, ``2Ki``), as the API server and the kubelet require."""
    try:
        return parse_count(value, f"{resource} request", minimum)
    except QuantityError as err:
        raise PodError(key, f"{err} (an extended resource counts whole devices)") from None


def _devices_ids(annotations: Mapping[str, str]) -> dict[str, SignedAnnotation]:
    """Each ``container-devices-ids.<target>`` annotation (target -> its value), with the
    ``signature-ids.<target>`` that signs it; checking the signature needs the node's key."""
    found: dict[str, SignedAnnotation] = {}
    for name, value in sorted(annotations.items()):
        if name.startswith(ids.ANN_DEVICES_IDS):
            target = name[len(ids.ANN_DEVICES_IDS):]
            signature = annotations.get(ids.signature_annotation(ids.KIND_IDS, target), "")
            found[target] = SignedAnnotation(value, signature)
    return found


def _share_request(key: str, spec: Mapping[str, Any], rules: PodRules) -> tuple[ShareSpec | None, int]:
    """The share a SharePod asks for (the first share resource found) and how many virtual
    devices its containers request together (per container, its limit or else its request: a
    whole number, at least 1)."""
    found: ShareSpec | None = None
    total = 0
    for container in spec.get("containers") or []:
        resources = container.get("resources") if isinstance(container, Mapping) else None
        if not isinstance(resources, Mapping):
            continue
        amounts = {**_as_dict(resources.get("requests")), **_as_dict(resources.get("limits"))}
        for name, value in amounts.items():
            wanted = parse_share_resource(str(name), rules.domain)
            if wanted is not None and (found is None or wanted == found):
                found, total = wanted, total + _devices(key, str(name), value, minimum=1)
    return found, total


def _as_dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _container_ids(status: Mapping[str, Any]) -> dict[str, str]:
    """Runtime ids from every kind of container status; odd shapes are skipped."""
    found: dict[str, str] = {}
    for field in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        items = status.get(field)
        for item in items if isinstance(items, list) else []:
            runtime = item.get("containerID") if isinstance(item, Mapping) else None
            name = item.get("name") if isinstance(item, Mapping) else None
            if isinstance(runtime, str) and isinstance(name, str) and "://" in runtime and runtime.split("://", 1)[1]:
                found[name] = runtime.split("://", 1)[1]
    return found


def _conditions(status: Mapping[str, Any]) -> dict[str, str]:
    """Condition type -> status; conditions of odd shapes are skipped."""
    found: dict[str, str] = {}
    items = status.get("conditions")
    for item in items if isinstance(items, list) else []:
        kind = item.get("type") if isinstance(item, Mapping) else None
        state = item.get("status") if isinstance(item, Mapping) else None
        if isinstance(kind, str) and isinstance(state, str):
            found[kind] = state
    return found


def _restarts(status: Mapping[str, Any]) -> dict[str, int]:
    """Container -> restartCount of the regular containers; odd shapes are skipped."""
    found: dict[str, int] = {}
    items = status.get("containerStatuses")
    for item in items if isinstance(items, list) else []:
        name = item.get("name") if isinstance(item, Mapping) else None
        count = item.get("restartCount") if isinstance(item, Mapping) else None
        if isinstance(name, str) and isinstance(count, int) and not isinstance(count, bool) and count >= 0:
            found[name] = count
    return found


def share_spec(key: str, annotations: Mapping[str, str]) -> ShareSpec:
    kind = annotations.get(ids.ANN_SHARE_KIND, "share")
    raw = annotations.get(ids.ANN_SHARE_SPEC, "")
    if kind not in SHARE_KINDS:
        raise PodError(key, f"{ids.ANN_SHARE_KIND}={kind!r}: expected share or share-dev")
    if not raw.isdigit() or raw.startswith("0") or not 1 <= int(raw) <= MAX_SHARE:
        raise PodError(key, f"{ids.ANN_SHARE_SPEC}={raw!r}: expected an integer 1..{MAX_SHARE}")
    return ShareSpec(kind, int(raw))


def using_of(conditions: Any) -> dict[str, str]:
    """The ShadowPod's ``Using`` condition: virtual device -> SharePod key ({} when free).

    The solver writes one condition of type ``gpushare.k8s.io/Using`` whose message is the
    JSON object; anything else in its place reads as no users."""
    for condition in conditions if isinstance(conditions, list) else []:
        if not isinstance(condition, Mapping) or condition.get("type") != ids.CONDITION_USING:
            continue
        if condition.get("status") != "True":
            return {}
        try:
            users = json.loads(str(condition.get("message") or ""))
        except ValueError:
            return {}
        if isinstance(users, dict):
            return {str(d): str(p) for d, p in users.items() if isinstance(p, str) and p}
    return {}


def _is_shadow(rules: PodRules, namespace: str, labels: Mapping[str, str]) -> tuple[bool, bool]:
    """(a ShadowPod, a pod that carries the label without being one)."""
    labelled = labels.get(ids.LABEL_POD_DESCRIPTION) == ids.SHADOW_POD_LABEL_VALUE
    ours = namespace == rules.system_namespace and labels.get(MANAGED_BY) == SHADOW_CONTROLLER
    return labelled and ours, labelled and not ours


def _kind_of(rules: PodRules, shadow: bool, requested: set[str]) -> PodKind:
    if shadow:
        return PodKind.SHADOW
    if any(rules.is_share(r) for r in requested):
        return PodKind.SHARE
    if rules.spot_resource in requested:
        return PodKind.SPOT
    if requested & set(rules.vendor_resources):
        return PodKind.RESERVED
    if any(rules.is_batch(r) for r in requested):
        return PodKind.BATCH
    return PodKind.ORDINARY


def read_pod(doc: Mapping[str, Any], rules: PodRules) -> Pod:
    """Read one pod (the API's JSON form); :class:`PodError` when it is malformed."""
    namespace, name = _identity(doc)
    key = f"{namespace}/{name}"
    meta = doc["metadata"]
    spec = _mapping(key, doc.get("spec"), "spec")
    status = _mapping(key, doc.get("status"), "status")
    containers = _containers(key, spec)
    labels = _strings(key, meta.get("labels"), "metadata.labels")
    annotations = _strings(key, meta.get("annotations"), "metadata.annotations")
    shadow, forged = _is_shadow(rules, namespace, labels)
    kind = _kind_of(rules, shadow, {r for rs in containers.values() for r in rs})
    priority = spec.get("priority") or 0
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise PodError(key, f"spec.priority must be an integer, not {priority!r}")
    marked = rules.lendable_value in (labels.get(rules.lendable_key), annotations.get(rules.lendable_key))
    lendable = kind is PodKind.RESERVED and marked
    share, share_devices = share_spec(key, annotations) if kind is PodKind.SHADOW else None, 0
    if kind is PodKind.SHARE:
        share, share_devices = _share_request(key, spec, rules)
    vcpu, vmem = _batch(key, spec, rules)
    return Pod(
        namespace=namespace, name=name, uid=str(meta.get("uid") or ""), node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or ""), terminating=bool(meta.get("deletionTimestamp")),
        created=str(meta.get("creationTimestamp") or ""), priority=priority, kind=kind, lendable=lendable,
        lendable_label=marked,
        forged_shadow=forged, containers=containers, container_ids=_container_ids(status),
        share=share, share_devices=share_devices,
        device_owner=annotations.get(ids.ANN_DEVICE_OWNER, "") if kind is PodKind.SHARE else "",
        using=using_of(status.get("conditions")) if kind is PodKind.SHADOW else {},
        isolation=annotations.get(ids.ANN_ISOLATION, "") if kind in (PodKind.SHADOW, PodKind.SHARE) else "",
        conditions=_conditions(status), restarts=_restarts(status),
        claims=_claims(key, spec), vcpu=vcpu, vmem=vmem, devices_ids=_devices_ids(annotations),
    )  # fmt: skip
