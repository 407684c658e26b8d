"""The scheduler's DRA part: pods' claims made, allocated on a node, reserved, released.

For a pod with ``spec.resourceClaims``:

- a claim from a ResourceClaimTemplate is created (``<pod>-<claim>-<random>``, owned by the
  pod, annotated ``resource.kubernetes.io/pod-claim-name``) and its name written into the
  pod's ``status.resourceClaimStatuses``, as Kubernetes' resourceclaim controller does;
- a node fits when every claim is already allocated there, or can be allocated from that
  node's ResourceSlices (:func:`.search.allocate`, given what other claims already take);
- on binding, each claim's ``status.allocation`` (results and a node selector for the node)
  and ``status.reservedFor`` (the pod) are written first.

:meth:`DraScheduling.release` runs every pass: pods gone from a claim's ``reservedFor`` are
dropped, an unreserved claim is deallocated, and a generated claim whose pod is gone deleted.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import extended
from .allocator import AllocationError, DeviceKey, Obj, Usage, read_slices, usage
from .search import allocate

POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"


class DraApi(Protocol):
    async def list_dra(self) -> DraObjects: ...
    async def create_claim(self, namespace: str, body: Obj) -> Obj: ...
    async def patch_claim_status(self, namespace: str, name: str, status: Obj) -> None: ...
    async def delete_claim(self, namespace: str, name: str) -> None: ...
    async def patch_pod_status(self, namespace: str, name: str, patch: Obj, strategic: bool = True) -> Obj: ...


@dataclass
class DraObjects:
    """One pass's view of the resource.k8s.io objects."""

    claims: list[Obj] = field(default_factory=list)
    templates: list[Obj] = field(default_factory=list)
    classes: list[Obj] = field(default_factory=list)
    slices: list[Obj] = field(default_factory=list)
    rules: list[Obj] = field(default_factory=list)

    def claim(self, namespace: str, name: str) -> Obj | None:
        return next((c for c in self.claims if (c["metadata"].get("namespace"), c["metadata"]["name"])
                     == (namespace, name)), None)


class NotReady(Exception):
    """The pod's claims are not there yet (or cannot be made): the message says why."""


def _meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def pod_claims(pod: Obj) -> list[Obj]:
    return [c for c in (pod.get("spec") or {}).get("resourceClaims") or [] if isinstance(c, dict)]


def claim_name(pod: Obj, entry: Mapping[str, Any]) -> str | None:
    if entry.get("resourceClaimName"):
        return str(entry["resourceClaimName"])
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if status.get("name") == entry.get("name") and status.get("resourceClaimName"):
            return str(status["resourceClaimName"])
    return None


def allocated_node(claim: Obj) -> str | None:
    """The node an allocated claim is bound to ("" for any node, None when not allocated)."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return None
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for field_ in term.get("matchFields") or []:
            if field_.get("key") == "metadata.name" and field_.get("values"):
                return str(field_["values"][0])
    return ""


def node_selector(node: str) -> Obj:
    return {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node]}]}]}


def _reference(pod: Obj) -> Obj:
    return {"resource": "pods", "name": _meta(pod)["name"], "uid": _meta(pod).get("uid", "")}


def from_template(pod: Obj, entry: Mapping[str, Any], template: Obj) -> Obj:
    meta = _meta(pod)
    spec = (template.get("spec") or {})
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {
            "name": f"{meta['name']}-{entry['name']}-{secrets.token_hex(3)[:5]}"[:253],
            "namespace": meta.get("namespace", "default"),
            "annotations": {POD_CLAIM_NAME: str(entry["name"])},
            "labels": dict((spec.get("metadata") or {}).get("labels") or {}),
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta.get("uid", ""),
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": spec.get("spec") or {},
    }


class DraScheduling:
    def __init__(self, api: DraApi) -> None:
        self.api = api
        self.objects = DraObjects()

    async def refresh(self) -> None:
        self.objects = await self.api.list_dra()

    async def ensure_claims(self, pod: Obj) -> list[Obj]:
        """The pod's claims, creating those its templates describe; NotReady while one is missing."""
        namespace, found = str(_meta(pod).get("namespace", "default")), []
        for entry in pod_claims(pod):
            name = claim_name(pod, entry)
            if name is None and entry.get("resourceClaimTemplateName"):
                name = await self._create(pod, entry)
            claim = self.objects.claim(namespace, name) if name else None
            if claim is None:
                raise NotReady(f"resource claim {entry.get('name')!r}: {name or 'no claim or template'} not found")
            found.append(claim)
        return found

    async def _create(self, pod: Obj, entry: Mapping[str, Any]) -> str:
        namespace = str(_meta(pod).get("namespace", "default"))
        template = next((t for t in self.objects.templates if (_meta(t).get("namespace"), _meta(t)["name"])
                         == (namespace, entry["resourceClaimTemplateName"])), None)
        if template is None:
            raise NotReady(f"ResourceClaimTemplate {namespace}/{entry['resourceClaimTemplateName']} not found")
        claim = await self.api.create_claim(namespace, from_template(pod, entry, template))
        self.objects.claims.append(claim)
        statuses = [*((pod.get("status") or {}).get("resourceClaimStatuses") or []),
                    {"name": entry["name"], "resourceClaimName": claim["metadata"]["name"]}]
        await self.api.patch_pod_status(namespace, _meta(pod)["name"], {"status": {"resourceClaimStatuses": statuses}},
                                        strategic=False)
        pod.setdefault("status", {})["resourceClaimStatuses"] = statuses
        return str(claim["metadata"]["name"])

    # --- extended resources served by DRA (KEP-5004) --------------------------------------

    def extended_resources(self, pod: Obj) -> set[str]:
        """The pod's extended resources a DeviceClass serves."""
        return extended.wanted(pod, extended.class_of(self.objects.classes))

    def extended_claim(self, pod: Obj, here: set[str]) -> Obj | None:
        """The pod's special claim for the resources DRA serves on a node (None: none there):
        the one an earlier pass made, or a new one in memory."""
        if not here:
            return None
        found = extended.claim_of(pod, self.objects.claims)
        if found is not None:
            return found
        requests, _ = extended.requests_and_mappings(pod, here, extended.class_of(self.objects.classes))
        return extended.special_claim(pod, requests)

    async def create_extended(self, pod: Obj, claims: list[Obj],
                              planned: dict[str, list[Obj]]) -> tuple[list[Obj], dict[str, list[Obj]]]:
        """Create the special claim made in memory and record it in the pod's status (its request
        mappings); the claims and the plan with its generated name."""
        made = next((c for c in claims if c["metadata"]["name"] == extended.IN_MEMORY), None)
        if made is None:
            return claims, planned
        namespace = str(_meta(pod).get("namespace", "default"))
        created = await self.api.create_claim(namespace, extended.for_creation(made))
        self.objects.claims.append(created)
        name = created["metadata"]["name"]
        resources = {r["exactly"]["deviceClassName"] for r in made["spec"]["devices"]["requests"]}
        classes = extended.class_of(self.objects.classes)
        here = {resource for resource, class_name in classes.items() if class_name in resources}
        _, mappings = extended.requests_and_mappings(pod, here & extended.wanted(pod, classes), classes)
        status = {"resourceClaimName": name, "requestMappings": mappings}
        await self.api.patch_pod_status(namespace, _meta(pod)["name"],
                                        {"status": {"extendedResourceClaimStatus": status}}, strategic=False)
        pod.setdefault("status", {})["extendedResourceClaimStatus"] = status
        plan = {(name if key == extended.IN_MEMORY else key): value for key, value in planned.items()}
        return [created if c is made else c for c in claims], plan

    def plan(self, claims: list[Obj], node: str) -> dict[str, list[Obj]]:
        """Claim name -> results to allocate on ``node`` (claims already there: none);
        AllocationError when the node cannot hold them all."""
        classes = {_meta(c)["name"]: c for c in self.objects.classes}
        devices = [d for d in read_slices(self.objects.slices) if d.node == node]
        used = usage(self.objects.claims)
        planned: dict[str, list[Obj]] = {}
        for claim in claims:
            where = allocated_node(claim)
            if where is not None:
                if where not in ("", node):
                    raise AllocationError(f"claim {_meta(claim)['name']} is allocated on node {where}")
                continue
            results = allocate(claim, classes, devices, used, self.objects.rules)
            planned[_meta(claim)["name"]] = results
            _add_usage(used, results)
        return planned

    async def reserve(self, pod: Obj, claims: list[Obj], planned: Mapping[str, list[Obj]], node: str) -> None:
        """Write the allocations and the pod's reservations (before the pod is bound)."""
        for claim in claims:
            name, status = _meta(claim)["name"], dict(claim.get("status") or {})
            if name in planned:
                status["allocation"] = {"devices": {"results": planned[name], "config": _configs(claim)},
                                        "nodeSelector": node_selector(node)}
            reserved = [r for r in status.get("reservedFor") or [] if r.get("uid") != _meta(pod).get("uid")]
            status["reservedFor"] = [*reserved, _reference(pod)]
            await self.api.patch_claim_status(_meta(claim)["namespace"], name, status)
            claim["status"] = status

    async def release(self, pods: Iterable[Obj]) -> int:
        """Drop reservations of pods that are gone; deallocate and delete what is left unused."""
        alive = {str(_meta(p).get("uid")) for p in pods
                 if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")}
        changed = 0
        for claim in list(self.objects.claims):
            meta, status = _meta(claim), claim.get("status") or {}
            owners = [o for o in meta.get("ownerReferences") or [] if o.get("kind") == "Pod"]
            if owners and not any(o.get("uid") in alive for o in owners):
                await self.api.delete_claim(meta["namespace"], meta["name"])
                changed += 1
                continue
            reserved = [r for r in status.get("reservedFor") or [] if r.get("uid") in alive]
            if reserved == list(status.get("reservedFor") or []) and (reserved or not status.get("allocation")):
                continue
            await self.api.patch_claim_status(meta["namespace"], meta["name"], {
                "reservedFor": reserved or None, **({} if reserved else {"allocation": None})})
            changed += 1
        return changed


def _configs(claim: Obj) -> list[Obj]:
    return [{"source": "FromClaim", **c} for c in ((claim.get("spec") or {}).get("devices") or {}).get("config") or []]


def _add_usage(used: dict[DeviceKey, Usage], results: list[Obj]) -> None:
    for result in results:
        item = used.setdefault((result["driver"], result["pool"], result["device"]), Usage())
        item.claims += 1
        for name, amount in (result.get("consumedCapacity") or {}).items():
            item.consumed[name] = item.consumed.get(name, 0) + int(amount)
