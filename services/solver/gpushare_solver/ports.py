"""What the executor needs from the outside world, as small protocols.

In production these are ``gpushare_common.adapters.kube.Kube``, the solver's
containerd adapter and the NATS bus; tests may pass anything with these methods.
What crosses a port is named here, so the solver's logic never imports an adapter: a
task's exit is defined here, the containerd errors are the shared containerd client's
(``gpushare_common.adapters.containerd``), re-exported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from gpushare_common.adapters.containerd import ContainerdError as ContainerdError
from gpushare_common.adapters.containerd import ContainerdUnavailable as ContainerdUnavailable
from gpushare_common.adapters.containerd import TaskNotFound as TaskNotFound
from gpushare_common.adapters.podresources import NodeDevices
from gpushare_common.events import DeviceHealth, Event, HealthApplied, KmodCommand, KmodReply

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class TaskExit:
    """How one container's task ended: ``gone`` when there was no task left to kill."""

    container_id: str
    exit_status: int | None
    gone: bool
    elapsed_ms: float
    direct: bool = False  # the init was signalled directly (containerd's Kill still to sweep)


class PodApi(Protocol):
    async def get_pod(self, namespace: str, name: str) -> Obj: ...

    async def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None,
                         uid: str = "") -> Obj | None: ...

    async def patch_pod(self, namespace: str, name: str, patch: Obj, strategic: bool = False) -> Obj: ...

    async def patch_pod_status(self, namespace: str, name: str, patch: Obj,
                               strategic: bool = True) -> Obj: ...

    async def list_pods(self, namespace: str | None = None, field_selector: str = "",
                        label_selector: str = "") -> tuple[list[Obj], str]: ...

    async def create_event(self, namespace: str, body: Obj) -> None: ...


class TaskApi(Protocol):
    async def kill_all(self, container_ids: list[str], timeout_s: float,
                       pids: dict[str, int] | None = None) -> list[TaskExit]: ...

    async def pids(self, container_ids: list[str]) -> dict[str, int]: ...


class Allocations(Protocol):
    """The kubelet's pod-resources: which devices each pod of the node was given. Raises
    ``gpushare_common.adapters.podresources.PodResourcesError`` when it cannot answer."""

    async def list(self) -> NodeDevices: ...


class Outbox(Protocol):
    """Publishing and kmod requests (the bus, seen from the executor)."""

    async def publish(self, subject: str, event: Event) -> None: ...

    async def publish_once(self, subject: str, event: Event) -> None: ...

    async def kmod(self, command: KmodCommand) -> KmodReply: ...

    async def fence(self, health: DeviceHealth) -> HealthApplied:
        """Have the device plugin apply ``health`` now; its answer says what it serves."""
        ...
