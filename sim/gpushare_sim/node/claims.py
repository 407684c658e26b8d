"""The kubelet's resource claims: prepared before a pod's containers start, unprepared after.

At admission, each of the pod's claims is read from the API (it must be allocated and
reserved for the pod), every driver named in its allocation is asked to prepare it (one
``NodePrepareResources`` per driver), and each container gets the CDI devices of the claims
(and requests) it names. Debian's containerd 1.6 applies no CDI devices itself, so they reach
the container as a ``container-devices-ids.<container>`` annotation signed with the node key,
which gpushare-runtime resolves through the same CDI specs (its CDI code). A claim shared by
several pods is prepared once and unprepared when the last of them is gone; an unprepare
that fails (a driver restarting) is tried again until it succeeds, as the kubelet does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpushare_common import ids

from gpushare_sim.node.adapters.dra import ClaimKey, DraError, DraPlugins
from gpushare_sim.node.adapters.kube import KubeError
from gpushare_sim.node.health import AllocatedDevice, DeviceKey, container_status
from gpushare_sim.node.model import PodDef

log = logging.getLogger("gpushare_sim.node.claims")
Obj = dict[str, Any]


class ClaimApi(Protocol):
    async def get_resource_claim(self, namespace: str, name: str) -> Obj: ...


class ClaimAdmissionError(Exception):
    """A claim the pod cannot run with: which and why."""


@dataclass
class Prepared:
    key: ClaimKey
    drivers: tuple[str, ...]
    devices: list[tuple[tuple[str, ...], tuple[str, ...]]]  # (request names, CDI device IDs)
    users: set[str] = field(default_factory=set)  # pod uids
    allocated: list[AllocatedDevice] = field(default_factory=list)  # every device, for its health


def cdi_annotations(key: bytes, node: str, container: str, cdi_ids: list[str]) -> dict[str, str]:
    """The signed ``container-devices-ids.<container>`` annotation naming CDI devices."""
    per_kind: dict[str, list[str]] = {}
    for qualified in cdi_ids:
        kind, _, name = qualified.partition("=")
        per_kind.setdefault(kind, []).append(name)
    value = ids.format_devices_ids(per_kind)
    return {ids.ANNOTATION_PREFIXES[ids.KIND_IDS] + container: value,
            ids.signature_annotation(ids.KIND_IDS, container): ids.sign(key, ids.KIND_IDS, node, container, value)}


def _results(claim: Obj) -> list[Mapping[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or [])


class ClaimPreparer:
    def __init__(self, plugins: DraPlugins, api: ClaimApi, key: bytes, node: str) -> None:
        self.plugins = plugins
        self.api = api
        self.key = key
        self.node = node
        self.prepared: dict[str, Prepared] = {}  # claim uid -> what was prepared
        self.containers: dict[tuple[str, str], list[tuple[str, str, list[str]]]] = {}
        self.entries: dict[tuple[str, str], list[tuple[str, str, str]]] = {}  # (entry, request, claim uid)
        self._lock = asyncio.Lock()  # pods are admitted and killed concurrently
        self.failing: dict[str, str] = {}  # claim uid -> why its unprepare failed last (logged once)

    async def _read(self, pod: PodDef, uid: str, name: str, claim: str | None) -> Obj:
        if claim is None:
            raise ClaimAdmissionError(f"resource claim {name!r} of pod {pod.key} has not been created")
        try:
            found = await self.api.get_resource_claim(pod.namespace, claim)
        except KubeError as err:
            raise ClaimAdmissionError(f"resource claim {pod.namespace}/{claim}: {err}") from None
        reserved = {r.get("uid") for r in (found.get("status") or {}).get("reservedFor") or []}
        if not _results(found) or uid not in reserved:
            raise ClaimAdmissionError(f"resource claim {pod.namespace}/{claim} is not allocated and reserved "
                                      f"for pod {pod.key}")
        return found

    async def prepare_pod(self, uid: str, pod: PodDef) -> dict[str, dict[str, str]]:
        """Container name -> the annotations that give it its claims' devices."""
        async with self._lock:
            return await self._prepare_pod(uid, pod)

    async def _prepare_pod(self, uid: str, pod: PodDef) -> dict[str, dict[str, str]]:
        by_entry: dict[str, Prepared] = {}
        for entry in pod.claims:
            claim = await self._read(pod, uid, entry.name, entry.claim)
            meta = claim["metadata"]
            key = ClaimKey(pod.namespace, meta["name"], meta["uid"])
            by_entry[entry.name] = await self._prepare(key, claim)
            by_entry[entry.name].users.add(uid)
        return {c.name: self._container(uid, c.name, c.claims, by_entry) for c in pod.containers if c.claims}

    async def _prepare(self, key: ClaimKey, claim: Obj) -> Prepared:
        known = self.prepared.get(key.uid)
        if known is not None:
            return known
        drivers = tuple(sorted({str(r.get("driver")) for r in _results(claim)}))
        devices: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
        allocated: list[AllocatedDevice] = []
        for driver in drivers:
            try:
                answer = (await self.plugins.prepare(driver, [key]))[key.uid]
            except DraError as err:
                raise ClaimAdmissionError(f"resource claim {key.namespace}/{key.name}: {err}") from None
            if answer.error:
                raise ClaimAdmissionError(f"resource claim {key.namespace}/{key.name}: {driver}: {answer.error}")
            devices += [(tuple(d.request_names), tuple(d.cdi_device_ids)) for d in answer.devices]
            allocated += [AllocatedDevice(driver, d.pool_name, d.device_name, tuple(d.cdi_device_ids))
                          for d in answer.devices]
        self.prepared[key.uid] = Prepared(key, drivers, devices, allocated=allocated)
        log.info("claim prepared claim=%s/%s drivers=%s", key.namespace, key.name, ",".join(drivers))
        return self.prepared[key.uid]

    def _container(self, uid: str, container: str, claims: tuple[tuple[str, str], ...],
                   by_entry: Mapping[str, Prepared]) -> dict[str, str]:
        found: list[tuple[str, str, list[str]]] = []
        for entry, request in claims:
            prepared = by_entry.get(entry)
            if prepared is None:
                raise ClaimAdmissionError(f"container {container} names resource claim {entry!r}, which the pod "
                                          "does not have")
            cdi = [c for requests, ids_ in prepared.devices
                   if not request or not requests or request in requests for c in ids_]
            found.append((prepared.key.namespace, prepared.key.name, cdi))
            self.entries.setdefault((uid, container), []).append((entry, request, prepared.key.uid))
        self.containers[(uid, container)] = found
        every = [c for _, _, cdi in found for c in cdi]
        return cdi_annotations(self.key, self.node, container, every) if every else {}

    async def release_pod(self, uid: str) -> None:
        """The pod is gone: unprepare the claims no other pod of this node uses."""
        async with self._lock:
            await self._release_pod(uid)

    async def _release_pod(self, uid: str) -> None:
        for key in [k for k in self.containers if k[0] == uid]:
            del self.containers[key]
            self.entries.pop(key, None)
        for prepared in self.prepared.values():
            prepared.users.discard(uid)
        await self._unprepare_unused()

    async def retry(self) -> None:
        """Unprepare again what failed to unprepare before."""
        if any(not p.users for p in self.prepared.values()):
            async with self._lock:
                await self._unprepare_unused()

    async def _unprepare_unused(self) -> None:
        for claim_uid, prepared in list(self.prepared.items()):
            if prepared.users:
                continue
            if all([await self._unprepare(driver, prepared) for driver in prepared.drivers]):
                del self.prepared[claim_uid]
                self.failing.pop(claim_uid, None)
                log.info("claim unprepared claim=%s/%s", prepared.key.namespace, prepared.key.name)

    async def _unprepare(self, driver: str, prepared: Prepared) -> bool:
        try:
            error = (await self.plugins.unprepare(driver, [prepared.key])).get(prepared.key.uid, "")
        except DraError as err:
            error = str(err)
        if error and self.failing.get(prepared.key.uid) != error:
            log.warning("claim not unprepared (tried again later) claim=%s: %s", prepared.key.name, error)
            self.failing[prepared.key.uid] = error
        return not error

    def resource_status(self, uid: str, containers: list[str]) -> dict[str, list[dict[str, Any]]]:
        """Per container of a pod: its ``allocatedResourcesStatus`` (the devices of the claims it
        names, with their health as the drivers report it)."""
        found = {}
        for container in containers:
            claims = [(entry, request, prepared.allocated) for entry, request, claim_uid
                      in self.entries.get((uid, container), []) if (prepared := self.prepared.get(claim_uid))]
            if claims:
                found[container] = container_status(claims, self.plugins.health)
        return found

    def pods_using(self, devices: set[DeviceKey]) -> set[str]:
        """The pods whose prepared claims hold any of ``devices``."""
        return {pod for prepared in self.prepared.values() if any(d.key in devices for d in prepared.allocated)
                for pod in prepared.users}

    def dynamic(self, uid: str, container: str) -> list[tuple[str, str, list[str]]]:
        """(claim namespace, claim name, CDI devices) of one container, for pod-resources."""
        return list(self.containers.get((uid, container), []))
