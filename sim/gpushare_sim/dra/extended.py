"""Extended resources served by DRA (``DRAExtendedResource``, KEP-5004), as the scheduler does it.

A DeviceClass serves the extended resource ``spec.extendedResourceName`` names, and every
class serves ``deviceclass.resource.kubernetes.io/<class>``. A pod asking for such a resource is
served by a node's device plugin where the node's allocatable has it, and by DRA where it has
none: the scheduler then creates one *special claim* for the pod (``<pod>-extended-resources-``,
owned by the pod, annotated ``resource.kubernetes.io/extended-resource-claim: "true"``) with a
request per container and resource, ``container-<i>-request-<j>`` (``i`` the container's index
among init and app containers, ``j`` the resource's index among the container's sorted
requests) of ``count`` devices of the class, allocates and reserves it, and records in the
pod's ``status.extendedResourceClaimStatus`` the claim and which request serves which
container's resource. Pure functions over the API's JSON objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpushare_common.quantity import QuantityError, parse_count

Obj = dict[str, Any]
ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
IN_MEMORY = "<extended-resources>"  # the claim's name until it is created (no valid name)


def class_of(classes: Iterable[Obj]) -> dict[str, str]:
    """Extended resource -> the DeviceClass serving it (explicit names, then implicit ones)."""
    found: dict[str, str] = {}
    for item in classes:
        name = str((item.get("metadata") or {}).get("name", ""))
        found.setdefault(IMPLICIT_PREFIX + name, name)
        explicit = (item.get("spec") or {}).get("extendedResourceName")
        if isinstance(explicit, str) and explicit:
            found[explicit] = name
    return found


def _containers(pod: Obj) -> list[Obj]:
    spec = pod.get("spec") or {}
    return [c for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])] if isinstance(c, dict)]


def _requests(container: Obj) -> dict[str, Any]:
    resources = container.get("resources") or {}
    return {**(resources.get("limits") or {}), **(resources.get("requests") or {})}


def _count(value: Any) -> int:
    """A request's number of devices (0: none, or no whole number)."""
    try:
        return parse_count(value, "extended resource request")
    except QuantityError:
        return 0


def wanted(pod: Obj, classes: Mapping[str, str]) -> set[str]:
    """The pod's extended resources a DeviceClass serves."""
    return {r for c in _containers(pod) for r, q in _requests(c).items() if r in classes and _count(q)}


def requests_and_mappings(pod: Obj, resources: Iterable[str],
                          classes: Mapping[str, str]) -> tuple[list[Obj], list[Obj]]:
    """The special claim's requests for ``resources`` and the pod's request mappings."""
    requests: list[Obj] = []
    mappings: list[Obj] = []
    chosen = set(resources)
    for index, container in enumerate(_containers(pod)):
        asked = _requests(container)
        for position, resource in enumerate(sorted(asked)):
            count = _count(asked[resource])
            if resource not in chosen or not count:
                continue
            name = f"container-{index}-request-{position}"
            requests.append({"name": name, "exactly": {"deviceClassName": classes[resource],
                                                       "allocationMode": "ExactCount", "count": count}})
            mappings.append({"containerName": container.get("name", ""), "resourceName": resource, "requestName": name})
    return requests, mappings


def special_claim(pod: Obj, requests: list[Obj]) -> Obj:
    meta = pod.get("metadata") or {}
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": IN_MEMORY, "generateName": f"{meta.get('name', '')}-extended-resources-"[:58],
                     "namespace": meta.get("namespace", "default"), "annotations": {ANNOTATION: "true"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta.get("name", ""),
                                          "uid": meta.get("uid", ""), "controller": True,
                                          "blockOwnerDeletion": True}]},
        "spec": {"devices": {"requests": requests}},
    }


def claim_of(pod: Obj, claims: Iterable[Obj]) -> Obj | None:
    """The pod's special claim from an earlier pass, if any."""
    uid = (pod.get("metadata") or {}).get("uid")
    for claim in claims:
        meta = claim.get("metadata") or {}
        if (meta.get("annotations") or {}).get(ANNOTATION) == "true" and any(
                o.get("uid") == uid and o.get("controller") for o in meta.get("ownerReferences") or []):
            return claim
    return None


def for_creation(claim: Obj) -> Obj:
    """The in-memory claim as it is created (its name generated by the API)."""
    meta = {k: v for k, v in claim["metadata"].items() if k != "name"}
    return {**claim, "metadata": meta}
