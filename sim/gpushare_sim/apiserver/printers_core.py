"""Table printers of the core kinds (pods, nodes, namespaces, events, ...)."""

from __future__ import annotations

from typing import Any

from .printers import AGE, NAME, Cells, Column, Obj, Printer, _meta, _part, age, human_duration, since, timestamp

_ROLE_PREFIX = "node-role.kubernetes.io/"
_NONE = "<none>"


def _pod_containers(obj: Obj) -> tuple[int, int, int, float | None, str | None]:
    """(ready, total, restarts, last restart time, container reason) from the container statuses."""
    status, spec = _part(obj, "status"), _part(obj, "spec")
    ready = restarts = 0
    last: float | None = None
    reason: str | None = None
    for container in reversed(status.get("containerStatuses") or []):
        restarts += int(container.get("restartCount") or 0)
        finished = timestamp(_part(_part(container, "lastState"), "terminated").get("finishedAt"))
        if finished is not None and (last is None or finished > last):
            last = finished
        state = _part(container, "state")
        waiting, terminated = _part(state, "waiting"), state.get("terminated")
        if waiting.get("reason"):
            reason = waiting["reason"]
        elif isinstance(terminated, dict):
            reason = terminated.get("reason") or _exit_reason(terminated)
        elif container.get("ready") and "running" in state:
            ready += 1
    return ready, len(spec.get("containers") or []), restarts, last, reason


def _exit_reason(terminated: Obj) -> str:
    signal = terminated.get("signal")
    return f"Signal:{signal}" if signal else f"ExitCode:{terminated.get('exitCode', 0)}"


def _pod_status(obj: Obj, reason: str | None, has_running: bool, ready_condition: bool) -> str:
    status = _part(obj, "status")
    phase = status.get("phase") or ""
    shown = status.get("reason") or phase
    if reason is not None:
        shown = reason
        if reason == "Completed" and has_running:
            shown = "Running" if ready_condition else "NotReady"
    if _meta(obj).get("deletionTimestamp") and phase not in ("Succeeded", "Failed"):
        shown = "Terminating"
    return str(shown)


def _pod_cells(obj: Obj, now: float) -> Cells:
    status, spec = _part(obj, "status"), _part(obj, "spec")
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or [] if isinstance(c, dict)}
    ready, total, restarts, last, reason = _pod_containers(obj)
    restarts_text = str(restarts)
    if restarts and last is not None:
        restarts_text = f"{restarts} ({human_duration(now - last)} ago)"
    ips = [ip.get("ip") for ip in status.get("podIPs") or [] if isinstance(ip, dict)]
    gates = [g.get("conditionType") for g in spec.get("readinessGates") or [] if isinstance(g, dict)]
    gates_text = f"{sum(conditions.get(g) == 'True' for g in gates)}/{len(gates)}" if gates else _NONE
    return [
        _meta(obj).get("name", ""), f"{ready}/{total}",
        _pod_status(obj, reason, ready > 0, conditions.get("Ready") == "True"), restarts_text, age(obj, now),
        (ips[0] if ips else status.get("podIP")) or _NONE, spec.get("nodeName") or _NONE,
        status.get("nominatedNodeName") or _NONE, gates_text,
    ]  # fmt: skip


def _node_cells(obj: Obj, now: float) -> Cells:
    status, labels = _part(obj, "status"), _meta(obj).get("labels") or {}
    ready = [c for c in status.get("conditions") or [] if isinstance(c, dict) and c.get("type") == "Ready"]
    states = ["Ready" if ready[0].get("status") == "True" else "NotReady"] if ready else ["Unknown"]
    if _part(obj, "spec").get("unschedulable"):
        states.append("SchedulingDisabled")
    roles = sorted({k[len(_ROLE_PREFIX) :] for k in labels if k.startswith(_ROLE_PREFIX) and k != _ROLE_PREFIX}
                   | ({labels["kubernetes.io/role"]} if labels.get("kubernetes.io/role") else set()))  # fmt: skip
    info = _part(status, "nodeInfo")
    return [
        _meta(obj).get("name", ""), ",".join(states), ",".join(roles) or _NONE, age(obj, now),
        info.get("kubeletVersion", ""), _address(status, "InternalIP"), _address(status, "ExternalIP"),
        info.get("osImage") or "<unknown>", info.get("kernelVersion") or "<unknown>",
        info.get("containerRuntimeVersion") or "<unknown>",
    ]  # fmt: skip


def _address(status: Obj, kind: str) -> str:
    for address in status.get("addresses") or []:
        if isinstance(address, dict) and address.get("type") == kind:
            return str(address.get("address", ""))
    return _NONE


def _namespace_cells(obj: Obj, now: float) -> Cells:
    return [_meta(obj).get("name", ""), _part(obj, "status").get("phase", ""), age(obj, now)]


def _event_cells(obj: Obj, now: float) -> Cells:
    first = since(obj.get("firstTimestamp") or obj.get("eventTime"), now)
    last = since(obj["lastTimestamp"], now) if obj.get("lastTimestamp") else first
    series, count = obj.get("series"), obj.get("count") or 1
    if isinstance(series, dict):
        last, count = since(series.get("lastObservedTime"), now), series.get("count") or count
    involved = _part(obj, "involvedObject")
    kind = str(involved.get("kind", "")).lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    return [
        last, obj.get("type", ""), obj.get("reason", ""), target, involved.get("fieldPath", ""),
        _source(obj), str(obj.get("message", "")).strip(), first, int(count), _meta(obj).get("name", ""),
    ]  # fmt: skip


def _source(obj: Obj) -> str:
    source = _part(obj, "source")
    component = source.get("component") or obj.get("reportingComponent") or ""
    host = source.get("host") or obj.get("reportingInstance") or ""
    return f"{component}, {host}" if host else str(component)


def _lease_cells(obj: Obj, now: float) -> Cells:
    return [_meta(obj).get("name", ""), _part(obj, "spec").get("holderIdentity") or "", age(obj, now)]


def _account_cells(obj: Obj, now: float) -> Cells:
    return [_meta(obj).get("name", ""), len(obj.get("secrets") or []), age(obj, now)]


def wide(name: str, **options: Any) -> Column:
    return Column(name, priority=1, **options)


CORE: dict[str, Printer] = {
    "pods": Printer((NAME, Column("Ready"), Column("Status"), Column("Restarts"), AGE, wide("IP"), wide("Node"),
                     wide("Nominated Node"), wide("Readiness Gates")), _pod_cells),
    "nodes": Printer((NAME, Column("Status"), Column("Roles"), AGE, Column("Version"), wide("Internal-IP"),
                      wide("External-IP"), wide("OS-Image"), wide("Kernel-Version"), wide("Container-Runtime")),
                     _node_cells),
    "namespaces": Printer((NAME, Column("Status"), AGE), _namespace_cells),
    "events": Printer((Column("Last Seen"), Column("Type"), Column("Reason"), Column("Object"), wide("Subobject"),
                       wide("Source"), Column("Message"), wide("First Seen"), wide("Count"),
                       wide("Name", format="name")), _event_cells),
    "leases": Printer((NAME, Column("Holder"), AGE), _lease_cells),
    "serviceaccounts": Printer((NAME, Column("Secrets", type="integer"), AGE), _account_cells),
}  # fmt: skip
