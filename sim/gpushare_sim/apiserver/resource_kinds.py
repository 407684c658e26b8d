"""Dynamic Resource Allocation kinds (resource.k8s.io): storage semantics only.

DeviceClass and ResourceSlice are cluster-scoped, ResourceClaim (with a status
subresource) and ResourceClaimTemplate are namespaced, DeviceTaintRule is
resource.k8s.io/v1alpha3 and cluster-scoped. Nothing here allocates: a claim's
`status.allocation` is whoever writes the status subresource's to set.
"""

from __future__ import annotations

from typing import Any

from .errors import invalid
from .kind import META_FIELDS, Kind, Obj

GROUP = "resource.k8s.io"
_NODE_CHOICES = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")


def _spec(obj: Obj) -> dict[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, dict) else {}


def _slice_create(obj: Obj) -> None:
    """The API server's required fields: driver, pool (name, slice count), one node choice."""
    name, spec = obj["metadata"].get("name", ""), _spec(obj)
    causes: list[tuple[str, str]] = []
    if not spec.get("driver"):
        causes.append(("spec.driver", "Required value"))
    pool: dict[str, Any] = spec["pool"] if isinstance(spec.get("pool"), dict) else {}
    if not pool.get("name"):
        causes.append(("spec.pool.name", "Required value"))
    if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] < 1:
        causes.append(("spec.pool.resourceSliceCount", "Invalid value: must be greater than zero"))
    chosen = [key for key in _NODE_CHOICES if spec.get(key) not in (None, "", False)]
    if len(chosen) != 1:
        causes.append(("spec", f"Invalid value: exactly one of {', '.join(_NODE_CHOICES)} is required"))
    if causes:
        raise invalid("ResourceSlice", name, causes)


def _slice_update(old: Obj, new: Obj) -> None:
    _slice_create(new)
    for path in ("driver", "nodeName"):
        if _spec(old).get(path) != _spec(new).get(path):
            raise invalid("ResourceSlice", old["metadata"]["name"], [(f"spec.{path}", "field is immutable")])


def _immutable_spec(kind: str) -> Any:
    def check(old: Obj, new: Obj) -> None:
        if old.get("spec") != new.get("spec"):
            raise invalid(kind, old["metadata"]["name"], [("spec", "field is immutable")])

    return check


DEVICECLASSES = Kind(
    plural="deviceclasses",
    kind="DeviceClass",
    model="V1DeviceClass",
    group=GROUP,
    delete_returns_object=True,
    namespaced=False,
)
RESOURCESLICES = Kind(
    plural="resourceslices",
    kind="ResourceSlice",
    model="V1ResourceSlice",
    group=GROUP,
    delete_returns_object=True,
    namespaced=False,
    field_labels=frozenset({"metadata.name", "spec.nodeName", "spec.driver"}),
    on_create=_slice_create,
    on_update=_slice_update,
)
RESOURCECLAIMS = Kind(
    plural="resourceclaims",
    kind="ResourceClaim",
    model="ResourceV1ResourceClaim",
    group=GROUP,
    delete_returns_object=True,
    status_subresource=True,
    field_labels=META_FIELDS,
    subresources=("status",),
    on_update=_immutable_spec("ResourceClaim.resource.k8s.io"),
)
RESOURCECLAIMTEMPLATES = Kind(
    plural="resourceclaimtemplates",
    kind="ResourceClaimTemplate",
    model="V1ResourceClaimTemplate",
    group=GROUP,
    delete_returns_object=True,
    on_update=_immutable_spec("ResourceClaimTemplate.resource.k8s.io"),
)
DEVICETAINTRULES = Kind(
    plural="devicetaintrules",
    kind="DeviceTaintRule",
    model="V1alpha3DeviceTaintRule",
    group=GROUP,
    delete_returns_object=True,
    version="v1alpha3",
    namespaced=False,
)

RESOURCE_KINDS: tuple[Kind, ...] = (
    DEVICECLASSES,
    RESOURCESLICES,
    RESOURCECLAIMS,
    RESOURCECLAIMTEMPLATES,
    DEVICETAINTRULES,
)
