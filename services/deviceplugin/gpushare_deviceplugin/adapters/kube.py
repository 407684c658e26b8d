"""This node's ShadowPods from the Kubernetes API, as full snapshots after each change.

Wraps :meth:`gpushare_common.adapters.kube.Kube.watch_pods`; imported lazily by
the app, so a process that does not watch ShadowPods does not load the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from gpushare_common import ids
from gpushare_common.adapters.kube import Kube
from gpushare_common.settings import KubeSettings

PodDoc = dict[str, Any]
SHADOW_SELECTOR = f"{ids.LABEL_POD_DESCRIPTION}={ids.SHADOW_POD_LABEL_VALUE}"


def _key(pod: PodDoc) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


async def watch_shadow_pods(settings: KubeSettings, node: str, stop: asyncio.Event,
                            kube: Kube | None = None) -> AsyncIterator[list[PodDoc]]:
    """Yield every ShadowPod on ``node`` (API JSON form) after each change, until ``stop``."""
    client = kube or Kube(settings)
    pods: dict[str, PodDoc] = {}
    changes = client.watch_pods(stop, field_selector=f"spec.nodeName={node}",
                                label_selector=SHADOW_SELECTOR)
    async for change in changes:
        if change.kind == "SYNC":
            pods = {_key(p): p for p in change.pods}
        elif change.pod is not None and change.kind == "DELETED":
            pods.pop(_key(change.pod), None)
        elif change.pod is not None:
            pods[_key(change.pod)] = change.pod
        yield list(pods.values())
