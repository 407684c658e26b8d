"""Kubernetes Events on pods (core/v1), built one way for every service that records them:
``kubectl describe pod`` and ``kubectl get events`` show them with the component and the node
(or instance) that reported them."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

NORMAL = "Normal"
WARNING = "Warning"


def rfc3339(at: float | None = None) -> str:
    """A timestamp as Kubernetes writes one (seconds, UTC); now when ``at`` is None."""
    return datetime.fromtimestamp(time.time() if at is None else at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_event(namespace: str, name: str, *, reason: str, message: str, component: str, instance: str,
              uid: str = "", warning: bool = False, host: str = "", related: tuple[str, str] | None = None,
              at: float | None = None) -> dict[str, Any]:
    """A core/v1 Event on the pod ``namespace/name`` (its ``uid`` when known), reported by
    ``component`` from ``instance`` (on node ``host``); ``related`` another pod (namespace, name)."""
    stamp = rfc3339(at)
    involved = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name}
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": namespace},
        "involvedObject": {**involved, **({"uid": uid} if uid else {})},
        "reason": reason, "message": message, "type": WARNING if warning else NORMAL,
        "source": {"component": component, **({"host": host} if host else {})},
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        "reportingComponent": component, "reportingInstance": instance,
    }  # fmt: skip
    if related is not None:
        body["related"] = {"apiVersion": "v1", "kind": "Pod", "namespace": related[0], "name": related[1]}
    return body
