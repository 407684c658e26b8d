"""Pods in the API's JSON shape, for the detector's tests and benchmark."""

from __future__ import annotations

from typing import Any

SHADOW_LABEL = {"gpushare.k8s.io/pod-description": "shadow-pod"}
SHADOW_LABELS = {**SHADOW_LABEL, "app.kubernetes.io/managed-by": "gpushare-shadow-controller"}
SYSTEM = "gpushare-system"


def pod(
    name: str,
    namespace: str = "ns",
    requests: dict[str, dict[str, str]] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    phase: str = "Running",
    node: str = "node-1",
    uid: str = "",
    deleting: bool = False,
) -> dict[str, Any]:
    """``requests`` maps container name -> {resource: quantity} (set as limits)."""
    containers = [
        {"name": c, "image": "busybox", "resources": {"limits": dict(r)}}
        for c, r in (requests or {"main": {}}).items()
    ]
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}",
                            "labels": dict(labels or {}), "annotations": dict(annotations or {})}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "containers": containers}, "status": {"phase": phase}}


def shadow(name: str, spec: int = 4, kind: str = "share", namespace: str = SYSTEM,
           labels: dict[str, str] | None = None, **kw: Any) -> dict[str, Any]:
    """A ShadowPod as the shadow-controller makes it (system namespace, its labels); other
    ``namespace``/``labels`` make a pod that only pretends to be one."""
    annotations = {"gpushare.k8s.io/share-spec": str(spec), "gpushare.k8s.io/share-kind": kind}
    return pod(name, namespace=namespace, requests={"main": {"nvidia.com/gpu": "1"}},
               labels=SHADOW_LABELS if labels is None else labels, annotations=annotations, **kw)


def share(name: str, resource: str = "gpushare/share-gpu-4", **kw: Any) -> dict[str, Any]:
    return pod(name, requests={"app": {resource: "1"}}, **kw)


def spot(name: str, **kw: Any) -> dict[str, Any]:
    return pod(name, requests={"job": {"gpushare/spot-gpu": "1"}}, **kw)


def reserved(name: str, lendable: bool = False, cards: int = 1, **kw: Any) -> dict[str, Any]:
    labels = {"gpushare.k8s.io/lendable": "true"} if lendable else {}
    return pod(name, requests={"main": {"nvidia.com/gpu": str(cards)}, "dind": {}}, labels=labels, **kw)
