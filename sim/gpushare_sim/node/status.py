"""Pod status bodies as the kubelet writes them (pure functions)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gpushare_sim.node.model import LogFile, PodDef

CONTAINER_ID_SCHEME = "containerd://"


def now_rfc3339(ts: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if ts is None else ts))


@dataclass
class ContainerState:
    name: str
    image: str
    container_id: str = ""
    previous_id: str = ""  # the instance before the last restart (its log is `logs --previous`)
    started_at: float | None = None
    exit_code: int | None = None
    finished_at: float | None = None
    restart_count: int = 0
    message: str = ""  # why the container could not start (the runtime's error)
    log: LogFile | None = None  # the current instance's output
    previous_log: LogFile | None = None  # the instance's before the last restart

    @property
    def running(self) -> bool:
        return self.started_at is not None and self.exit_code is None

    def status(self) -> dict[str, Any]:
        if self.exit_code is not None:
            state: dict[str, Any] = {
                "terminated": {
                    "exitCode": self.exit_code,
                    "reason": "StartError" if self.message else "Completed" if self.exit_code == 0 else "Error",
                    "startedAt": now_rfc3339(self.started_at),
                    "finishedAt": now_rfc3339(self.finished_at),
                    "containerID": CONTAINER_ID_SCHEME + self.container_id,
                }
            }
            if self.message:
                state["terminated"]["message"] = self.message
        elif self.started_at is not None:
            state = {"running": {"startedAt": now_rfc3339(self.started_at)}}
        else:
            state = {"waiting": {"reason": "ContainerCreating"}}
        body: dict[str, Any] = {
            "name": self.name, "image": self.image, "imageID": "", "restartCount": self.restart_count,
            "ready": self.running, "started": self.started_at is not None, "state": state,
        }  # fmt: skip
        if self.container_id:
            body["containerID"] = CONTAINER_ID_SCHEME + self.container_id
        return body


def pod_phase(containers: list[ContainerState], restart_policy: str = "Never") -> str:
    if any(c.started_at is None for c in containers):
        return "Pending"
    if restart_policy == "Always" or any(c.exit_code is None for c in containers):
        return "Running"
    if all(c.exit_code == 0 for c in containers):
        return "Succeeded"
    return "Running" if restart_policy == "OnFailure" else "Failed"


def _condition(kind: str, ok: bool) -> dict[str, str]:
    return {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": now_rfc3339()}


def pod_status(pod: PodDef, containers: list[ContainerState], host_ip: str) -> dict[str, Any]:
    phase = pod_phase(containers, pod.restart_policy)
    ready = phase == "Running" and all(c.running for c in containers)
    return {
        "phase": phase,
        "hostIP": host_ip,
        "podIP": host_ip,
        "startTime": now_rfc3339(min((c.started_at or time.time()) for c in containers)),
        "conditions": [
            _condition("PodScheduled", True),
            _condition("Initialized", True),
            _condition("ContainersReady", ready),
            _condition("Ready", ready),
        ],
        "containerStatuses": [c.status() for c in containers],
    }


def admission_failure(reason: str, message: str) -> dict[str, Any]:
    return {"phase": "Failed", "reason": reason, "message": message}
