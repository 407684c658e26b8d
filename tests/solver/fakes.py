"""In-memory stand-ins for the Kubernetes API, the kubelet's pod-resources and containerd, for the
service wired in memory."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from gpushare_common.adapters.kube import NotFound
from gpushare_solver.ports import ContainerdUnavailable, TaskExit

Obj = dict[str, Any]


@dataclass
class FakePods:
    """The API's pods, and the kubelet's word on their devices (``list``, pod-resources)."""

    pods: dict[str, Obj] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    patches: list[tuple[str, Obj]] = field(default_factory=list)
    allocated: dict[str, dict[str, dict[str, tuple[str, ...]]]] = field(default_factory=dict)
    events: list[Obj] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)  # "<call> <pod>", in order
    gone: dict[str, Obj] = field(default_factory=dict)  # deleted pods as they were last

    async def list(self) -> dict[str, dict[str, dict[str, tuple[str, ...]]]]:
        return copy.deepcopy(self.allocated)

    def add(self, key: str, node: str, containers: list[str],
            devices: dict[str, tuple[str, ...]] | None = None) -> None:
        """A pod in the API; with ``devices``, also one the kubelet runs, its first container given them."""
        if devices is not None:
            self.allocated[key] = {"c0": dict(devices)}
        namespace, name = key.split("/")
        self.pods[key] = {"metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}"},
                          "spec": {"nodeName": node},
                          "status": {"phase": "Running", "containerStatuses": [
                              {"name": f"c{i}", "containerID": f"containerd://{c}"}
                              for i, c in enumerate(containers)]}}

    def _get(self, namespace: str, name: str) -> Obj:
        pod = self.pods.get(f"{namespace}/{name}")
        if pod is None:
            raise NotFound(f"pod {namespace}/{name} not found", 404)
        return pod

    async def get_pod(self, namespace: str, name: str) -> Obj:
        return copy.deepcopy(self._get(namespace, name))

    async def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None,
                         uid: str = "") -> Obj | None:
        self._get(namespace, name)
        self.deleted.append(f"{namespace}/{name}")
        self.allocated.pop(f"{namespace}/{name}", None)
        self.calls.append(f"delete {namespace}/{name}")
        self.gone[f"{namespace}/{name}"] = self.pods[f"{namespace}/{name}"]
        return self.pods.pop(f"{namespace}/{name}")

    async def patch_pod(self, namespace: str, name: str, patch: Obj, strategic: bool = False) -> Obj:
        self.patches.append((f"{namespace}/{name}", patch))
        return self._get(namespace, name)

    async def patch_pod_status(self, namespace: str, name: str, patch: Obj, strategic: bool = True) -> Obj:
        """Conditions merged by type, as a strategic merge patch of a pod's status does."""
        pod = await self.patch_pod(namespace, name, patch)
        self.calls.append(f"status {namespace}/{name}")
        status = pod.setdefault("status", {})
        for condition in patch.get("status", {}).get("conditions", []):
            status["conditions"] = [*(c for c in status.get("conditions", []) if c["type"] != condition["type"]),
                                    condition]
        return pod

    async def create_event(self, namespace: str, body: Obj) -> None:
        involved = body["involvedObject"]
        self.calls.append(f"event {involved['namespace']}/{involved['name']}")
        self.events.append(body)

    async def list_pods(self, namespace: str | None = None, field_selector: str = "",
                        label_selector: str = "") -> tuple[list[Obj], str]:
        return [copy.deepcopy(p) for p in self.pods.values()], "1"


@dataclass
class FakeTasks:
    running: set[str] = field(default_factory=set)
    failures: int = 0  # the next calls that fail as if containerd were down
    calls: int = 0

    async def pids(self, container_ids: list[str]) -> dict[str, int]:
        return {}

    async def kill_all(self, container_ids: list[str], timeout_s: float,
                       pids: dict[str, int] | None = None) -> list[TaskExit]:
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise ContainerdUnavailable("kill", "socket refused")
        exits = [TaskExit(c, 137 if c in self.running else None, c not in self.running, 0.1)
                 for c in container_ids]
        self.running.difference_update(container_ids)
        return exits
