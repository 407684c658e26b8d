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



async def watch_shadow_pods(settings: KubeSettings, node: str, stop: asyncio.Event,
                            kube: Kube | None = None) -> AsyncIterator[list[PodDoc]]:
    """Yield every ShadowPod on ``node`` (API JSON form) after each change, until ``stop``: only
    the system namespace is watched, where only the shadow-controller may create pods."""
    client = kube or Kube(settings)
    try:
        async for pods in client.watch_pod_sets(stop, settings.system_namespace,
                                                field_selector=f"spec.nodeName={node}", label_selector=SHADOW_SELECTOR):
            yield pods
    finally:
        if kube is None:
            await client.close()
