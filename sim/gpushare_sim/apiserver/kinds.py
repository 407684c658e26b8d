"""The resource kinds the emulator serves and the rules that differ between them."""

from __future__ import annotations

from typing import Any

from .errors import invalid
from .kind import META_FIELDS, Kind, Obj, valid_name
from .resource_kinds import RESOURCE_KINDS

__all__ = ["BY_PATH", "KINDS", "Kind", "Obj", "valid_name"]
_META_FIELDS = META_FIELDS


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
    "serviceAccountName": "default",  # the ServiceAccount admission plugin's default
}
_MUTABLE_POD_SPEC = ("activeDeadlineSeconds", "terminationGracePeriodSeconds", "tolerations")
_IMMUTABLE_MESSAGE = (
    "Forbidden: pod updates may not change fields other than spec.containers[*].image, "
    "spec.initContainers[*].image, spec.activeDeadlineSeconds, spec.tolerations, "
    "spec.terminationGracePeriodSeconds; spec.nodeName is set by binding"
)


def _default_requests(spec: Obj) -> None:
    """A container's requests default to its limits, resource by resource, as the API server
    defaults them (containers and init containers)."""
    for group in ("containers", "initContainers"):
        for container in spec.get(group) or []:
            resources = container.get("resources") if isinstance(container, dict) else None
            if not isinstance(resources, dict) or not isinstance(resources.get("limits"), dict):
                continue
            requests = resources.get("requests")
            if resources["limits"]:
                resources["requests"] = {**resources["limits"], **(requests if isinstance(requests, dict) else {})}


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
    _default_requests(spec)
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
    if isinstance(new.get("spec"), dict):
        _default_requests(new["spec"])
    if _without_mutable(old.get("spec")) != _without_mutable(new.get("spec")):
        raise invalid("Pod", old["metadata"]["name"], [("spec", _IMMUTABLE_MESSAGE)])
    for key, value in _POD_DEFAULTS.items():
        new["spec"].setdefault(key, value)


def _event_create(event: Obj) -> None:
    if not isinstance(event.get("involvedObject"), dict):
        raise invalid("Event", event["metadata"].get("name", ""), [("involvedObject", "Required value")])


def _namespace_create(namespace: Obj) -> None:
    spec: dict[str, Any] = namespace["spec"] if isinstance(namespace.get("spec"), dict) else {}
    finalizers = list(spec.get("finalizers") or [])
    namespace["spec"] = {**spec, "finalizers": finalizers or ["kubernetes"]}
    namespace["status"] = {"phase": "Active"}


PODS = Kind(
    plural="pods",
    kind="Pod",
    model="V1Pod",
    status_subresource=True,
    graceful_delete=True,
    delete_returns_object=True,
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
    categories=("all",),
    subresources=("status", "binding", "eviction", "log"),
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

SERVICEACCOUNTS = Kind(
    plural="serviceaccounts",
    kind="ServiceAccount",
    model="V1ServiceAccount",
    short_names=("sa",),
    subresources=("token",),
    delete_returns_object=True,
)
TOKENREVIEWS = Kind(
    plural="tokenreviews",
    kind="TokenReview",
    model="V1TokenReview",
    group="authentication.k8s.io",
    namespaced=False,
    verbs=("create",),
    stored=False,
)

KINDS: tuple[Kind, ...] = (PODS, NODES, NAMESPACES, EVENTS, SERVICEACCOUNTS, LEASES, TOKENREVIEWS, *RESOURCE_KINDS)
BY_PATH: dict[tuple[str, str, str], Kind] = {(k.group, k.version, k.plural): k for k in KINDS}
