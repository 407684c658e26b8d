"""The driver's Kubernetes calls: read a claim, publish the node's ResourceSlice.

Loaded lazily (the client is heavy) and used only through these two small classes; the
adapter's errors become :class:`ClaimUnreadable` (a claim's own error) or
:class:`PublishError` here.
"""

from __future__ import annotations

from typing import Any

from gpushare_common.adapters.kube import Conflict, Kube, KubeError, NotFound
from gpushare_common.logging import get_logger
from gpushare_common.settings import KubeSettings

from ..prepare import ClaimUnreadable

log = get_logger("dra.kube")
Obj = dict[str, Any]


class PublishError(Exception):
    """The slice could not be written (the next change or resync tries again)."""


class Claims:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    async def get_claim(self, namespace: str, name: str) -> Obj:
        try:
            return await self.kube.get_resource_claim(namespace, name)
        except NotFound:
            raise ClaimUnreadable(f"claim {namespace}/{name}: not found") from None
        except KubeError as err:
            raise ClaimUnreadable(f"claim {namespace}/{name}: cannot be read: {err}") from None


class Events:
    """Records Events on pods; a failure is logged (an Event is information, never a step)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    async def record(self, namespace: str, body: Obj) -> bool:
        try:
            await self.kube.create_event(namespace, body)
        except KubeError as err:
            log.warning("event not recorded", namespace=namespace, pod=body["involvedObject"]["name"],
                        reason=body.get("reason"), error=str(err))
            return False
        return True


class Slices:
    """Writes the node's slices; removes this driver's other slices of the node."""

    def __init__(self, kube: Kube, node: str, driver: str) -> None:
        self.kube = kube
        self.selector = f"spec.nodeName={node},spec.driver={driver}"
        self._version: dict[str, str] = {}

    async def publish(self, body: Obj) -> None:
        await self.publish_all([body])

    async def publish_all(self, bodies: list[Obj]) -> None:
        """Write every slice of the pool (each a whole object); delete this driver's others."""
        keep = {body["metadata"]["name"] for body in bodies}
        for body in bodies:
            name = body["metadata"]["name"]
            try:
                await self._write(name, body, keep)
            except Conflict:  # someone else wrote it (or it changed under us): read, then write again
                self._version.pop(name, None)
                await self._refresh(keep)
                try:
                    await self._write(name, body, keep)
                except KubeError as err:
                    raise PublishError(f"ResourceSlice {name}: {err}") from None
            except KubeError as err:
                raise PublishError(f"ResourceSlice {name}: {err}") from None
        if set(self._version) - keep:  # the pool had more slices before (a setting changed)
            try:
                await self._refresh(keep)
            except KubeError as err:
                raise PublishError(f"stale ResourceSlices: {err}") from None

    async def _write(self, name: str, body: Obj, keep: set[str]) -> None:
        version = self._version.get(name)
        if version is None:
            await self._refresh(keep)
            version = self._version.get(name)
        if version is None:
            created = await self.kube.create_resource_slice(body)
        else:
            meta = {**body["metadata"], "resourceVersion": version}
            created = await self.kube.replace_resource_slice(name, {**body, "metadata": meta})
        self._version[name] = str(created["metadata"]["resourceVersion"])

    async def _refresh(self, keep: set[str]) -> None:
        """Read this driver's slices of the node; delete all but ``keep``."""
        for item in await self.kube.list_resource_slices(self.selector):
            name = item["metadata"]["name"]
            if name in keep:
                self._version[name] = str(item["metadata"].get("resourceVersion", ""))
                continue
            self._version.pop(name, None)
            try:
                await self.kube.delete_resource_slice(name)
                log.info("stale ResourceSlice deleted", slice=name)
            except NotFound:
                pass

    async def remove(self, name: str) -> None:
        try:
            await self.kube.delete_resource_slice(name)
        except NotFound:
            pass
        except KubeError as err:
            raise PublishError(f"ResourceSlice {name}: {err}") from None
        self._version.pop(name, None)


def connect(settings: KubeSettings) -> Kube:
    return Kube(settings)
