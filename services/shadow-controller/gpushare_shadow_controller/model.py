"""Slim records of the pods the controller cares about, classified once per watch event.

Only these records are kept (never whole pod objects), so 10,000 pods cost
little memory and a reconcile pass touches small objects only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gpushare_common import ids
from gpushare_common.mapping import QuotaKey

_FINISHED = ("Succeeded", "Failed")


@dataclass(slots=True)
class SharePod:
    key: str
    quota: QuotaKey
    count: int  # virtual devices requested
    node: str
    pending: bool  # waiting for devices: not scheduled, not terminating
    active: bool  # bound to a node and not finished or terminating
    owner: str  # gpushare.k8s.io/device-owner, "" until the solver sets it


@dataclass(slots=True)
class ShadowPod:
    key: str
    name: str
    quota: QuotaKey
    node: str
    phase: str
    terminating: bool
    created: str
    using: int  # devices marked used by Using conditions


Record = SharePod | ShadowPod


def share_resource_pattern(domain: str) -> re.Pattern[str]:
    return re.compile(rf"{re.escape(domain)}/(share|share-dev)-gpu-([1-9][0-9]*)\Z")


def _requests(container: dict[str, Any]) -> dict[str, Any]:
    resources = container.get("resources") or {}
    return {**(resources.get("limits") or {}), **(resources.get("requests") or {})}


def _count(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def count_using(conditions: list[dict[str, Any]] | None) -> int:
    """Devices in use according to the ShadowPod's ``gpushare.k8s.io/Using`` condition.

    The solver writes one condition whose message is JSON ``{virtual device: SharePod}``;
    a True condition whose message is not such an object counts as one device.
    """
    used = 0
    for condition in conditions or []:
        if not str(condition.get("type", "")).startswith(ids.CONDITION_USING):
            continue
        if condition.get("status") != "True":
            continue
        try:
            users = json.loads(condition.get("message") or "")
        except ValueError:
            users = None
        used += len(users) if isinstance(users, dict) and users else 1
    return used


def classify(pod: dict[str, Any], pattern: re.Pattern[str]) -> Record | None:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    namespace, name = meta.get("namespace", ""), meta.get("name", "")
    key = ids.pod_key(namespace, name)
    terminating = bool(meta.get("deletionTimestamp"))
    phase = status.get("phase") or "Pending"
    node = spec.get("nodeName") or ""
    if (meta.get("labels") or {}).get(ids.LABEL_POD_DESCRIPTION) == ids.SHADOW_POD_LABEL_VALUE:
        annotations = meta.get("annotations") or {}
        kind = annotations.get(ids.ANN_SHARE_KIND, "share")
        share_spec = _count(annotations.get(ids.ANN_SHARE_SPEC, "0"))
        if kind not in ("share", "share-dev") or share_spec < 1:
            return None
        return ShadowPod(key, name, QuotaKey(namespace, kind, share_spec), node, phase,
                         terminating, meta.get("creationTimestamp") or "",
                         count_using(status.get("conditions")))
    for container in spec.get("containers") or []:
        for resource, value in _requests(container).items():
            match = pattern.match(resource)
            if match:
                quota = QuotaKey(namespace, match.group(1), int(match.group(2)))
                finished = phase in _FINISHED
                return SharePod(
                    key, quota, max(1, _count(value)), node,
                    pending=not node and not terminating and not finished,
                    active=bool(node) and not terminating and not finished,
                    owner=(meta.get("annotations") or {}).get(ids.ANN_DEVICE_OWNER, ""),
                )
    return None
