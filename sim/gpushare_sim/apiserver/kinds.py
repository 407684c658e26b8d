"""The resource kinds the emulator serves and the rules that differ between them."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from .errors import invalid

Obj = dict[str, Any]

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_META_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


def _no_defaults(obj: Obj) -> None:
    return None


@dataclass(frozen=True)
class Kind:
    """One REST resource: where it lives and how it behaves."""

    plural: str
    kind: str
    model: str  # name of the official client's model, used for schema checks
    group: str = ""
    version: str = "v1"
    namespaced: bool = True
    status_subresource: bool = False
    graceful_delete: bool = False
    field_labels: frozenset[str] = _META_FIELDS
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    on_create: Callable[[Obj], None] = field(default=_no_defaults)
    on_update: Callable[[Obj, Obj], None] = field(default=lambda old, new: None)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    def field_value(self, obj: Obj, label: str) -> str:
        """The value a field selector compares with ("" when the field is absent)."""
        node: Any = obj
        for part in _path(label):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, bool):
            return "true" if node else "false"
        return "" if node is None else str(node)


@cache
def _path(label: str) -> tuple[str, ...]:
    return tuple(("source.component" if label == "source" else label).split("."))


def _qos_class(spec: Obj) -> str:
    containers = list(spec.get("containers") or []) + list(spec.get("initContainers") or [])
    requests_any, guaranteed = False, True
    for container in containers:
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        if requests or limits:
            requests_any = True
        for name in ("cpu", "memory"):
            if name not in limits or requests.get(name, limits[name]) != limits[name]:
                guaranteed = False
    if not requests_any:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


_POD_DEFAULTS = {
    "restartPolicy": "Always",
    "terminationGracePeriodSeconds": 30,
    "schedulerName": "default-scheduler",
    "dnsPolicy": "ClusterFirst",
}
_MUTABLE_POD_SPEC = ("activeDeadlineSeconds", "terminationGracePeriodSeconds", "tolerations")
_IMMUTABLE_MESSAGE = (
    "Forbidden: pod updates may not change fields other than spec.containers[*].image, "
    "spec.initContainers[*].image, spec.activeDeadlineSeconds, spec.tolerations, "
    "spec.terminationGracePeriodSeconds; spec.nodeName is set by binding"
)


def _pod_create(pod: Obj) -> None:
    spec = pod.get("spec")
    name = pod["metadata"].get("name", "")
    containers = spec.get("containers") if isinstance(spec, dict) else None
    if not containers:
        raise invalid("Pod", name, [("spec.containers", "Required value")])
    for index, container in enumerate(containers):
        if not container.get("name"):
            raise invalid("Pod", name, [(f"spec.containers[{index}].name", "Required value")])
    assert isinstance(spec, dict)
    for key, value in _POD_DEFAULTS.items():
        spec.setdefault(key, value)
    pod["status"] = {"phase": "Pending", "qosClass": _qos_class(spec)}


def _without_mutable(spec: Any) -> Any:
    """The pod spec with the fields an update may change blanked out."""
    if not isinstance(spec, dict):
        return spec
    result = {**_POD_DEFAULTS, **spec}
    for key in _MUTABLE_POD_SPEC:
        result.pop(key, None)
    for group in ("containers", "initContainers"):
        if isinstance(result.get(group), list):
            result[group] = [
                {k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c
                for c in result[group]
            ]
    return result


def _pod_update(old: Obj, new: Obj) -> None:
    if _without_mutable(old.get("spec")) != _without_mutable(new.get("spec")):
        raise invalid("Pod", old["metadata"]["name"], [("spec", _IMMUTABLE_MESSAGE)])
    for key, value in _POD_DEFAULTS.items():
        new["spec"].setdefault(key, value)


def _event_create(event: Obj) -> None:
    if not isinstance(event.get("involvedObject"), dict):
        raise invalid("Event", event["metadata"].get("name", ""), [("involvedObject", "Required value")])


def _namespace_create(namespace: Obj) -> None:
    namespace["status"] = {"phase": "Active"}


PODS = Kind(
    plural="pods",
    kind="Pod",
    model="V1Pod",
    status_subresource=True,
    graceful_delete=True,
    field_labels=_META_FIELDS
    | {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    },
    short_names=("po",),
    subresources=("status", "binding", "eviction"),
    on_create=_pod_create,
    on_update=_pod_update,
)
NODES = Kind(
    plural="nodes",
    kind="Node",
    model="V1Node",
    namespaced=False,
    status_subresource=True,
    field_labels=frozenset({"metadata.name", "spec.unschedulable"}),
    short_names=("no",),
    subresources=("status",),
)
NAMESPACES = Kind(
    plural="namespaces",
    kind="Namespace",
    model="V1Namespace",
    namespaced=False,
    status_subresource=True,
    field_labels=frozenset({"metadata.name", "status.phase"}),
    short_names=("ns",),
    subresources=("status",),
    on_create=_namespace_create,
)
EVENTS = Kind(
    plural="events",
    kind="Event",
    model="CoreV1Event",
    field_labels=_META_FIELDS
    | {f"involvedObject.{f}" for f in ("kind", "namespace", "name", "uid", "apiVersion")}
    | {"involvedObject.resourceVersion", "involvedObject.fieldPath"}
    | {"reason", "reportingComponent", "source", "type"},
    short_names=("ev",),
    on_create=_event_create,
)
LEASES = Kind(
    plural="leases",
    kind="Lease",
    model="V1Lease",
    group="coordination.k8s.io",
)

KINDS: tuple[Kind, ...] = (PODS, NODES, NAMESPACES, EVENTS, LEASES)
BY_PATH: dict[tuple[str, str, str], Kind] = {(k.group, k.version, k.plural): k for k in KINDS}


def valid_name(name: str) -> bool:
    return 0 < len(name) <= 253 and _DNS_SUBDOMAIN.match(name) is not None
