"""Where a SharePod may run, and so where a ShadowPod made for it must run.

A SharePod may name its node (``nodeSelector``, a required node affinity): it can use only the
virtual devices of a ShadowPod on such a node. Demand is therefore counted per quota key *and*
placement, and a ShadowPod created for a placement carries the same constraints (merged into the
template's own) and the placement itself in ``gpushare.k8s.io/placement``, so every later pass
knows which demand it serves. A ShadowPod serves a placement when the placement asks for nothing,
when it was made for that placement, or when the placement names only a node
(``kubernetes.io/hostname``) and the ShadowPod runs there. Other ShadowPods are never counted
for a constrained SharePod: the controller does not read nodes' labels, and counting a ShadowPod on
a node the SharePod cannot use left it pending while the ShadowPod idled elsewhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

HOSTNAME = "kubernetes.io/hostname"
ANYWHERE_TEXT = ""


@dataclass(frozen=True, slots=True)
class Placement:
    """A pod's node constraints as canonical JSON (``""``: anywhere); made by :meth:`of`, which also
    keeps the node it names when it names only a node (read on every pass, so parsed once)."""

    text: str = ANYWHERE_TEXT
    hostname: str = ""  # the node it names when it names a node and nothing else

    @classmethod
    def of_pod(cls, pod: dict[str, Any]) -> Placement:
        spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
        assert isinstance(spec, dict)
        selector = spec.get("nodeSelector")
        affinity = spec.get("affinity")
        required = None
        if isinstance(affinity, dict) and isinstance(affinity.get("nodeAffinity"), dict):
            required = affinity["nodeAffinity"].get("requiredDuringSchedulingIgnoredDuringExecution")
        return cls.of(selector if isinstance(selector, dict) else {}, required if isinstance(required, dict) else {})

    @classmethod
    def of(cls, node_selector: dict[str, Any], required: dict[str, Any]) -> Placement:
        body: dict[str, Any] = {}
        if node_selector:
            body["nodeSelector"] = {str(k): str(v) for k, v in node_selector.items()}
        if required:
            body["required"] = required
        if not body:
            return cls()
        selector = body.get("nodeSelector", {})
        only_node = set(body) == {"nodeSelector"} and set(selector) == {HOSTNAME}
        return cls(json.dumps(body, sort_keys=True, separators=(",", ":")), selector[HOSTNAME] if only_node else "")

    @classmethod
    def of_annotation(cls, value: object) -> Placement:
        """The placement a ShadowPod was made for; anywhere when it has none or it does not read
        (such a ShadowPod serves the SharePods that ask for no node, and those whose node it is on)."""
        if not isinstance(value, str) or not value:
            return cls()
        try:
            body = json.loads(value)
        except ValueError:
            return cls()
        if not isinstance(body, dict) or not set(body) <= {"nodeSelector", "required"}:
            return cls()
        selector, required = body.get("nodeSelector", {}), body.get("required", {})
        if not isinstance(selector, dict) or not isinstance(required, dict):
            return cls()
        return cls.of(selector, required)

    @property
    def anywhere(self) -> bool:
        return not self.text

    def body(self) -> dict[str, Any]:
        value = json.loads(self.text) if self.text else {}
        assert isinstance(value, dict)
        return value

    def serves(self, wanted: Placement, node: str) -> bool:
        """Whether a ShadowPod of this placement, on ``node`` (``""`` before it is scheduled), can
        give a virtual device to a SharePod that wants ``wanted``."""
        return wanted.anywhere or wanted == self or (bool(node) and wanted.hostname == node)

    def apply(self, spec: dict[str, Any]) -> None:
        """Put the constraints on a ShadowPod's spec (the SharePod's selector wins over the template's)."""
        body = self.body()
        if body.get("nodeSelector"):
            spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **body["nodeSelector"]}
        if body.get("required"):
            spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})[
                "requiredDuringSchedulingIgnoredDuringExecution"] = body["required"]


ANYWHERE = Placement()
