"""Kubernetes API access for the node simulator and the scheduler.

Built on the project's Kubernetes adapter (``gpushare_common.adapters.kube``:
the ``kubernetes`` package, objects as plain dicts, list + watch, its error tree
:class:`KubeError` / :class:`NotFound` / :class:`Conflict` / ...), adding what
only a kubelet and a scheduler do: register the Node and write its status,
write pod status, confirm deletions, bind pods.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

from gpushare_common.adapters.kube import TAINT_API, Conflict, Kube, KubeError, NotFound, resource_path
from gpushare_common.settings import KubeSettings

from gpushare_sim.dra.scheduling import DraObjects

__all__ = ["Conflict", "KubeError", "NotFound", "SimKube"]

Obj = dict[str, Any]
MERGE = "application/merge-patch+json"


class SimKube(Kube):
    @classmethod
    def from_kubeconfig(cls, path: str) -> SimKube:
        return cls(KubeSettings(kubeconfig=path))

    # --- the kubelet's writes ------------------------------------------------------

    async def ensure_node(self, name: str, labels: dict[str, str]) -> None:
        body: Any = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
        try:
            await self._rest(f"create node {name}", "POST", "/api/v1/nodes", body)
        except Conflict:
            await self._rest(f"label node {name}", "PATCH", _node_path(name), {"metadata": {"labels": labels}}, MERGE)

    async def patch_node_status(self, name: str, status: Obj) -> None:
        await self._rest(f"patch node status {name}", "PATCH", _node_path(name) + "/status", {"status": status},
                         MERGE)

    async def write_pod_status(self, namespace: str, name: str, status: Obj) -> None:
        await self.patch_pod_status(namespace, name, {"status": status}, strategic=False)

    async def confirm_pod_deletion(self, namespace: str, name: str) -> None:
        """Delete with grace 0, as the kubelet does once the containers are gone."""
        try:
            await self.delete_pod(namespace, name, grace_seconds=0)
        except NotFound:
            pass

    async def patch_event(self, namespace: str, name: str, patch: Obj) -> None:
        """Count a repeat of an event (count, lastTimestamp), as client-go's recorder does."""
        path = "/api/v1/namespaces/{}/events/{}".format(*(urllib.parse.quote(p, safe="") for p in (namespace, name)))
        await self._rest(f"patch event {namespace}/{name}", "PATCH", path, patch, MERGE)

    # --- reads ---------------------------------------------------------------------

    async def list_node_pods(self, node: str) -> list[Obj]:
        pods, _ = await self.list_pods(field_selector=f"spec.nodeName={node}")
        return [p for p in pods if (p.get("spec") or {}).get("nodeName") == node]

    async def watch_node_pods(self, node: str, stop: asyncio.Event) -> AsyncIterator[list[Obj]]:
        """The full set of pods bound to ``node``, again after every change (list + watch)."""
        async for pods in self.watch_pod_sets(stop, field_selector=f"spec.nodeName={node}"):
            yield [p for p in pods if (p.get("spec") or {}).get("nodeName") == node]

    # --- any object (the sim's controllers and the scenarios; the services use typed calls) ---

    async def list_objects(self, path: str, field_selector: str = "", label_selector: str = ""
                           ) -> tuple[list[Obj], str]:
        return await self._list_objects(path, field_selector, label_selector)

    async def get_object(self, path: str) -> Obj:
        return await self._rest(f"get {path}", "GET", path)  # type: ignore[no-any-return]

    async def create_object(self, path: str, body: Obj) -> Obj:
        return await self._rest(f"create in {path}", "POST", path, body)  # type: ignore[no-any-return]

    async def patch_object(self, path: str, patch: Obj) -> Obj:
        return await self._rest(f"patch {path}", "PATCH", path, patch, MERGE)  # type: ignore[no-any-return]

    async def delete_object(self, path: str) -> None:
        await self._delete_object(path)

    # --- Dynamic Resource Allocation: the scheduler's and the kubelet's calls ------------

    async def list_dra(self) -> DraObjects:
        """Every claim, template, class, slice and taint rule (one pass of the scheduler)."""
        found = {plural: (await self.list_objects(resource_path(plural)))[0] for plural in
                 ("resourceclaims", "resourceclaimtemplates", "deviceclasses", "resourceslices")}
        try:
            rules, _ = await self.list_objects(resource_path("devicetaintrules", api=TAINT_API))
        except NotFound:
            rules = []
        return DraObjects(claims=found["resourceclaims"], templates=found["resourceclaimtemplates"],
                          classes=found["deviceclasses"], slices=found["resourceslices"], rules=rules)

    async def create_claim(self, namespace: str, body: Obj) -> Obj:
        return await self.create_object(resource_path("resourceclaims", namespace), body)

    async def patch_claim_status(self, namespace: str, name: str, status: Obj) -> None:
        await self.patch_object(resource_path("resourceclaims", namespace, name, "status"), {"status": status})

    async def delete_claim(self, namespace: str, name: str) -> None:
        try:
            await self.delete_object(resource_path("resourceclaims", namespace, name))
        except NotFound:
            pass

    # --- the scheduler's write -----------------------------------------------------

    async def bind_pod(self, namespace: str, name: str, node: str) -> None:
        body: Any = {
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }  # fmt: skip
        quoted = (urllib.parse.quote(p, safe="") for p in (namespace, name))
        path = "/api/v1/namespaces/{}/pods/{}/binding".format(*quoted)
        await self._rest(f"bind pod {namespace}/{name} to {node}", "POST", path, body)


def _node_path(name: str) -> str:
    return "/api/v1/nodes/" + urllib.parse.quote(name, safe="")
