"""The node simulator's own view of pods and containers, parsed from the
Kubernetes JSON form, and the container specs handed to a runner.

Parsers raise :class:`PodError` (a ``ValueError``) naming the field and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from gpushare_common import quantity


class PodError(ValueError):
    def __init__(self, where: str, value: object, reason: str) -> None:
        self.where = where
        self.value = value
        self.reason = reason
        super().__init__(f"{where}: {reason} (got {str(value)[:80]!r})")


def parse_quantity(value: object, where: str = "quantity") -> Decimal:
    """A Kubernetes quantity (``2``, ``500m``, ``1Gi``, ``1e3``) as an exact Decimal, not negative
    (:mod:`gpushare_common.quantity` reads it)."""
    try:
        number = quantity.parse_quantity(value, where)
    except quantity.QuantityError as err:
        shown = value if not isinstance(value, int) else "an integer too large"
        raise PodError(where, shown, f"not a Kubernetes quantity: {err.reason}") from None
    if number < 0:
        raise PodError(where, value, "must be a non-negative quantity")
    return number


@dataclass(frozen=True, slots=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = "rwm"


@dataclass(frozen=True, slots=True)
class BindMount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class LogFile:
    """Where one container instance's output is: as the program wrote it, or in the CRI log
    format (``<time> <stream> <F|P> <text>`` lines, as containerd's CRI plugin writes it)."""

    path: Path
    cri: bool = False


@dataclass(frozen=True, slots=True)
class Started:
    """A started container: the runtime's id for it (containerd's, through CRI) and its output."""

    container_id: str
    log: LogFile


@dataclass(frozen=True, slots=True)
class ContainerDef:
    name: str
    image: str
    args: list[str]
    env: dict[str, str]
    resources: dict[str, Decimal]
    claims: tuple[tuple[str, str], ...] = ()  # (the pod's claim entry, its request or "")


@dataclass(frozen=True, slots=True)
class PodClaim:
    """One of the pod's resource claims: its entry name and the ResourceClaim's (None: not made yet)."""

    name: str
    claim: str | None


@dataclass(frozen=True, slots=True)
class PodDef:
    namespace: str
    name: str
    uid: str
    node_name: str
    annotations: dict[str, str]
    labels: dict[str, str]
    containers: list[ContainerDef]
    node_selector: dict[str, str] = field(default_factory=dict)
    deleting: bool = False
    phase: str = "Pending"
    restart_policy: str = "Always"
    claims: tuple[PodClaim, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def requests(self) -> dict[str, Decimal]:
        total: dict[str, Decimal] = {}
        for container in self.containers:
            for resource, amount in container.resources.items():
                total[resource] = total.get(resource, Decimal(0)) + amount
        return total


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """Everything a runner needs to start one container.

    ``annotations``: what the OCI spec carries when the runner writes the spec itself (every pod
    annotation, the Allocate annotations, the CRI identity keys); a CRI runner sends ``pod``'s
    annotations with the sandbox and ``allocated_annotations`` with the container instead, and
    containerd writes the spec's annotations from them as its runtime handler allows.
    ``container_id``: the kubelet's name for this instance (its ``workdir``); a CRI runner's
    container gets containerd's id (see :class:`Started`).
    """

    container_id: str
    args: list[str]
    env: dict[str, str]
    devices: list[DeviceNode]
    mounts: list[BindMount]
    annotations: dict[str, str]
    workdir: Path
    pod: PodDef
    name: str = ""  # the container's name in the pod
    attempt: int = 0  # restarts before this instance
    allocated_annotations: dict[str, str] = field(default_factory=dict)


def _str_map(value: object, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise PodError(where, value, "expected a map of strings")
    return dict(value)


def _resources(value: Any, where: str) -> dict[str, Decimal]:
    if not isinstance(value, dict):
        return {}
    merged = {**_str_or_int_map(value.get("requests"), f"{where}.requests")}
    merged.update(_str_or_int_map(value.get("limits"), f"{where}.limits"))
    return {r: parse_quantity(q, f"{where}[{r}]") for r, q in merged.items()}


def _str_or_int_map(value: object, where: str) -> dict[str, object]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PodError(where, value, "expected a map")
    return dict(value)


def _container(value: Any, where: str) -> ContainerDef:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise PodError(where, value, "a container needs a name")
    args = [*(value.get("command") or []), *(value.get("args") or [])]
    if not all(isinstance(a, str) for a in args):
        raise PodError(f"{where}.command", args, "command and args must be strings")
    env = {
        e["name"]: str(e.get("value", ""))
        for e in value.get("env") or []
        if isinstance(e, dict) and isinstance(e.get("name"), str)
    }
    resources = _resources(value.get("resources"), f"{where}.resources")
    return ContainerDef(value["name"], str(value.get("image") or ""), args, env, resources,
                        _container_claims(value.get("resources"), f"{where}.resources.claims"))


def _container_claims(resources: Any, where: str) -> tuple[tuple[str, str], ...]:
    claims = resources.get("claims") if isinstance(resources, dict) else None
    if claims is None:
        return ()
    if not isinstance(claims, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in claims):
        raise PodError(where, claims, "expected a list of {name, request?}")
    return tuple((c["name"], str(c.get("request") or "")) for c in claims)


def _pod_claims(spec: dict[str, Any], status: dict[str, Any], where: str) -> tuple[PodClaim, ...]:
    entries = spec.get("resourceClaims") or []
    named = isinstance(entries, list) and all(isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries)
    if not named:
        raise PodError(f"{where} spec.resourceClaims", entries, "expected a list of {name, ...}")
    made = {s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []
            if isinstance(s, dict)}
    return tuple(PodClaim(e["name"], e.get("resourceClaimName") or made.get(e["name"]) or None) for e in entries)


def _extended(status: dict[str, Any], where: str) -> tuple[str, dict[str, dict[str, str]]]:
    """The pod's claim for extended resources DRA serves (``status.extendedResourceClaimStatus``):
    its name ("" when none) and, per container, resource -> the claim's request serving it."""
    found = status.get("extendedResourceClaimStatus")
    if not found:
        return "", {}
    name = found.get("resourceClaimName") if isinstance(found, dict) else None
    mappings = found.get("requestMappings") if isinstance(found, dict) else None
    if not isinstance(name, str) or not name or not isinstance(mappings, list) or not all(
            isinstance(m, dict) and all(isinstance(m.get(k), str) for k in ("containerName", "resourceName",
                                                                              "requestName")) for m in mappings):
        raise PodError(f"{where} status.extendedResourceClaimStatus", found,
                       "expected {resourceClaimName, requestMappings: [{containerName, resourceName, requestName}]}")
    per_container: dict[str, dict[str, str]] = {}
    for mapping in mappings:
        per_container.setdefault(mapping["containerName"], {})[mapping["resourceName"]] = mapping["requestName"]
    return name, per_container


def _served_by_claim(container: ContainerDef, claim: str, mapped: dict[str, str]) -> ContainerDef:
    """A container whose extended resources the special claim serves: those are claim requests,
    not device-plugin resources."""
    if not mapped:
        return container
    resources = {r: q for r, q in container.resources.items() if r not in mapped}
    claims = (*container.claims, *((claim, request) for request in sorted(set(mapped.values()))))
    return ContainerDef(container.name, container.image, container.args, container.env, resources, claims)


def parse_pod(obj: Any) -> PodDef:
    """Parse a pod in its JSON form (as the API returns it)."""
    if not isinstance(obj, dict):
        raise PodError("pod", obj, "expected an object")
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    status = obj.get("status") or {}
    name, namespace = meta.get("name"), meta.get("namespace", "default")
    if not isinstance(name, str) or not isinstance(namespace, str):
        raise PodError("pod.metadata", meta, "name and namespace must be strings")
    where = f"pod {namespace}/{name}"
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise PodError(f"{where} spec.containers", containers, "need at least one container")
    special, mapped = _extended(status, where)
    parsed = [_served_by_claim(_container(c, f"{where} container[{i}]"), special,
                               mapped.get(c.get("name", "") if isinstance(c, dict) else "", {}))
              for i, c in enumerate(containers)]
    return PodDef(
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid") or ""),
        node_name=str(spec.get("nodeName") or ""),
        annotations=_str_map(meta.get("annotations"), f"{where} annotations"),
        labels=_str_map(meta.get("labels"), f"{where} labels"),
        containers=parsed,
        node_selector=_str_map(spec.get("nodeSelector"), f"{where} nodeSelector"),
        deleting=bool(meta.get("deletionTimestamp")),
        phase=str(status.get("phase") or "Pending"),
        restart_policy=_restart_policy(spec.get("restartPolicy"), where),
        claims=_pod_claims(spec, status, where) + ((PodClaim(special, special),) if special else ()),
    )


def _restart_policy(value: object, where: str) -> str:
    if value is None:
        return "Always"
    if value not in ("Always", "OnFailure", "Never"):
        raise PodError(f"{where} spec.restartPolicy", value, "expected Always, OnFailure or Never")
    return str(value)
