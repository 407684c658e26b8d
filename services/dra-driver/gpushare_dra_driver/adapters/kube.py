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


class Slices:
    """Writes the node's slice; removes this driver's other slices of the node."""

    def __init__(self, kube: Kube, node: str, driver: str) -> None:
        self.kube = kube
        self.selector = f"spec.nodeName={node},spec.driver={driver}"
        self._version: dict[str, str] = {}

    async def publish(self, body: Obj) -> None:
        name = body["metadata"]["name"]
        try:
            await self._write(name, body)
        except Conflict:  # someone else wrote it (or it changed under us): read, then write again
            self._version.pop(name, None)
            await self._refresh(keep=name)
            try:
                await self._write(name, body)
            except KubeError as err:
                raise PublishError(f"ResourceSlice {name}: {err}") from None
        except KubeError as err:
            raise PublishError(f"ResourceSlice {name}: {err}") from None

    async def _write(self, name: str, body: Obj) -> None:
        version = self._version.get(name)
        if version is None:
            await self._refresh(keep=name)
            version = self._version.get(name)
        if version is None:
            created = await self.kube.create_resource_slice(body)
        else:
            meta = {**body["metadata"], "resourceVersion": version}
            created = await self.kube.replace_resource_slice(name, {**body, "metadata": meta})
        self._version[name] = str(created["metadata"]["resourceVersion"])

    async def _refresh(self, keep: str) -> None:
        """Read this driver's slices of the node; delete all but ``keep``."""
        for item in await self.kube.list_resource_slices(self.selector):
            name = item["metadata"]["name"]
            if name == keep:
                self._version[name] = str(item["metadata"].get("resourceVersion", ""))
                continue
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
