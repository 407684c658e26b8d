"""containerd's gRPC API on its unix socket: tasks (get, list, kill, wait) and containers (get, list).

The one containerd client of gpushare. It uses the project's own minimal protos of
``containerd.services.tasks.v1.Tasks`` and ``containerd.services.containers.v1.Containers``
(compiled into :mod:`gpushare_common.adapters.kubeletapi`) and puts the namespace in the
``containerd-namespace`` gRPC metadata, as containerd's own clients do: the client's namespace,
or the one a call names.

A container's OCI spec travels as a ``google.protobuf.Any`` whose value is the spec's JSON; only
its ``annotations`` are decoded (none when the spec is absent or is not a JSON object with
string annotations).

Errors: :class:`TaskNotFound` (no such task, or its process already finished),
:class:`ContainerNotFound`, :class:`ContainerdUnavailable` (socket down or missing, no answer
in time, client not opened) and :class:`ContainerdError` for everything else (all three are
ContainerdErrors); no gRPC exception escapes.
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc
import msgspec

from gpushare_common.adapters.kubeletapi import (
    containerd_containers_v1_pb2 as containers_pb2,
)
from gpushare_common.adapters.kubeletapi import (
    containerd_containers_v1_pb2_grpc as containers_grpc,
)
from gpushare_common.adapters.kubeletapi import (
    containerd_task_types_pb2 as types_pb2,
)
from gpushare_common.adapters.kubeletapi import (
    containerd_tasks_v1_pb2 as tasks_pb2,
)
from gpushare_common.adapters.kubeletapi import (
    containerd_tasks_v1_pb2_grpc as tasks_grpc,
)

DEFAULT_NAMESPACE = "k8s.io"  # the CRI plugin's (the kubelet's containers)


class ContainerdError(Exception):
    """A containerd call failed: ``what`` was being done, ``detail`` is containerd's answer."""

    def __init__(self, what: str, detail: str = "") -> None:
        self.what = what
        self.detail = detail
        super().__init__(f"containerd {what}: {detail}".rstrip(": "))


class TaskNotFound(ContainerdError):
    """No such task in the namespace (never started, or already deleted)."""


class ContainerNotFound(ContainerdError):
    """No such container in the namespace."""


class ContainerdUnavailable(ContainerdError):
    """containerd did not answer: its socket is missing or refuses, or the call timed out."""


@dataclass(frozen=True, slots=True)
class Task:
    """A container's task (its init process): ``status`` is containerd's name for its state,
    ``CREATED``, ``RUNNING``, ``PAUSING``, ``PAUSED``, ``STOPPED`` or ``UNKNOWN``."""

    container_id: str
    pid: int
    status: str
    exit_status: int = 0


@dataclass(frozen=True, slots=True)
class Container:
    """A container's metadata: its labels and its OCI spec's annotations."""

    id: str
    labels: dict[str, str]
    annotations: dict[str, str]


class _SpecAnnotations(msgspec.Struct):
    annotations: dict[str, str] | None = None


_SPEC_DECODER = msgspec.json.Decoder(_SpecAnnotations)


def spec_annotations(spec: bytes) -> dict[str, str]:
    """The ``annotations`` of an OCI spec's JSON; {} when there are none or it cannot be read."""
    if not spec:
        return {}
    try:
        return _SPEC_DECODER.decode(spec).annotations or {}
    except (msgspec.DecodeError, msgspec.ValidationError):
        return {}


def _task(process: Any) -> Task:
    return Task(process.id or process.container_id, int(process.pid),
                str(types_pb2.Status.Name(process.status)), int(process.exit_status))


def _container(message: Any) -> Container:
    return Container(message.id, dict(message.labels), spec_annotations(message.spec.value))


class ContainerdClient:
    """A client of one containerd socket; use it as an async context manager (or call
    :meth:`open` and :meth:`close`). ``namespace`` is the default of every call."""

    def __init__(self, address: str, namespace: str = DEFAULT_NAMESPACE, call_timeout_s: float = 5.0) -> None:
        self.address = address
        self.namespace = namespace
        self.call_timeout_s = call_timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._tasks: tasks_grpc.TasksStub | None = None
        self._containers: containers_grpc.ContainersStub | None = None

    async def __aenter__(self) -> ContainerdClient:
        self.open()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    @property
    def is_open(self) -> bool:
        return self._channel is not None

    def open(self) -> None:
        """Create the channel (it connects on the first call); call it inside the event loop."""
        if self._channel is not None:
            return
        target = self.address if "://" in self.address else f"unix://{self.address}"
        self._channel = grpc.aio.insecure_channel(target)
        self._tasks = tasks_grpc.TasksStub(self._channel)
        self._containers = containers_grpc.ContainersStub(self._channel)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel, self._tasks, self._containers = None, None, None

    # -- tasks ----------------------------------------------------------------------------------

    async def task(self, container_id: str, namespace: str | None = None) -> Task:
        """The task of a container; :class:`TaskNotFound` when it has none."""
        reply = await self._call(self._stubs()[0].Get, tasks_pb2.GetRequest(container_id=container_id),
                                 f"get task {container_id}", TaskNotFound, namespace)
        return _task(reply.process)

    async def tasks(self, namespace: str | None = None) -> list[Task]:
        """Every task of the namespace, whatever its state."""
        reply = await self._call(self._stubs()[0].List, tasks_pb2.ListTasksRequest(), "list tasks",
                                 ContainerdError, namespace)
        return [_task(process) for process in reply.tasks]

    async def pid(self, container_id: str, namespace: str | None = None) -> int:
        """The host pid of a running task's init process; 0 when the task is not running."""
        task = await self.task(container_id, namespace)
        return task.pid if task.status == "RUNNING" else 0

    async def kill(self, container_id: str, sig: int = signal.SIGKILL, all_processes: bool = True,
                   namespace: str | None = None) -> None:
        """Send ``sig`` to the task's init, or to every process of the container."""
        request = tasks_pb2.KillRequest(container_id=container_id, signal=sig, all=all_processes)
        await self._call(self._stubs()[0].Kill, request, f"kill task {container_id}", TaskNotFound, namespace)

    async def wait(self, container_id: str, timeout_s: float, namespace: str | None = None) -> int:
        """Block until the task has exited; returns its exit status. No exit within ``timeout_s``
        is :class:`ContainerdUnavailable`."""
        reply = await self._call(self._stubs()[0].Wait, tasks_pb2.WaitRequest(container_id=container_id),
                                 f"wait task {container_id}", TaskNotFound, namespace, timeout_s)
        return int(reply.exit_status)

    # -- containers -----------------------------------------------------------------------------

    async def container(self, container_id: str, namespace: str | None = None) -> Container:
        """A container's labels and annotations; :class:`ContainerNotFound` when there is none."""
        reply = await self._call(self._stubs()[1].Get, containers_pb2.GetContainerRequest(id=container_id),
                                 f"get container {container_id}", ContainerNotFound, namespace)
        return _container(reply.container)

    async def containers(self, *filters: str, namespace: str | None = None) -> list[Container]:
        """The containers of the namespace that match any of ``filters`` (containerd's filter
        syntax, e.g. ``id==abc`` or ``labels."io.kubernetes.pod.name"==web``); all without one."""
        reply = await self._call(self._stubs()[1].List, containers_pb2.ListContainersRequest(filters=filters),
                                 "list containers", ContainerdError, namespace)
        return [_container(message) for message in reply.containers]

    # -- plumbing -------------------------------------------------------------------------------

    def _stubs(self) -> tuple[tasks_grpc.TasksStub, containers_grpc.ContainersStub]:
        if self._tasks is None or self._containers is None:
            raise ContainerdUnavailable("call", f"client of {self.address} not opened")
        return self._tasks, self._containers

    async def _call(self, rpc: Callable[..., Awaitable[Any]], request: Any, what: str,
                    not_found: type[ContainerdError], namespace: str | None, timeout_s: float | None = None) -> Any:
        metadata = (("containerd-namespace", namespace or self.namespace),)
        timeout = self.call_timeout_s if timeout_s is None else timeout_s
        try:
            return await rpc(request, metadata=metadata, timeout=timeout)
        except grpc.aio.AioRpcError as err:
            raise self._translate(err, what, not_found) from None

    def _translate(self, err: grpc.aio.AioRpcError, what: str, not_found: type[ContainerdError]) -> ContainerdError:
        code, detail = err.code(), err.details() or ""
        if code == grpc.StatusCode.NOT_FOUND:
            return not_found(what, detail)
        # containerd passes the call's deadline on to the shim and may answer first that it ran
        # out (UNKNOWN "context deadline exceeded"): the same timeout as the client's own
        timed_out = code == grpc.StatusCode.DEADLINE_EXCEEDED or "context deadline exceeded" in detail
        if code == grpc.StatusCode.UNAVAILABLE or timed_out:
            return ContainerdUnavailable(what, f"{self.address}: {code.name} {detail}")
        return ContainerdError(what, f"{code.name} {detail}")
