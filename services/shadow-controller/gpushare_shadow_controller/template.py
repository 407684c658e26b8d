"""The ShadowPod a quota key needs: one container ``main`` holding one real card, sleeping."""

from __future__ import annotations

import secrets
from typing import Any

from gpushare_common import ids
from gpushare_common.mapping import QuotaKey

from .settings import ShadowSettings


def shadow_name(quota: QuotaKey) -> str:
    return f"gpushare-shadow-{quota.kind}-{quota.spec}-{secrets.token_hex(3)}"


def shadow_pod(quota: QuotaKey, name: str, settings: ShadowSettings) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{
            "name": ids.SHADOW_CONTAINER,
            "image": settings.image,
            "resources": {"limits": {settings.vendor_resource: "1"},
                          "requests": {settings.vendor_resource: "1"}},
        }],
        "automountServiceAccountToken": False,  # a pause container needs no API access
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 0,
        "tolerations": settings.tolerations_list(),
    }
    if settings.priority_class:
        spec["priorityClassName"] = settings.priority_class
    if settings.runtime_class:
        spec["runtimeClassName"] = settings.runtime_class
    selector = settings.node_selector_map()
    if selector:
        spec["nodeSelector"] = selector
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": quota.namespace,
            "labels": {ids.LABEL_POD_DESCRIPTION: ids.SHADOW_POD_LABEL_VALUE,
                       "app.kubernetes.io/managed-by": "gpushare-shadow-controller"},
            "annotations": {ids.ANN_SHARE_KIND: quota.kind, ids.ANN_SHARE_SPEC: str(quota.spec)},
        },
        "spec": spec,
    }
