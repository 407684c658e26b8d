"""containerd's tasks service over gRPC: kill a container's processes and wait for them to exit.

The only module of the solver that talks to containerd. It uses the project's
own minimal protos of ``containerd.services.tasks.v1.Tasks`` (compiled into
``gpushare_common.adapters.kubeletapi``) and puts the namespace in the
``containerd-namespace`` gRPC metadata, as containerd's own clients do.
Errors are the task port's (``ports``): :class:`TaskNotFound` (no such task, or
its process already finished), :class:`ContainerdUnavailable` (socket down,
timeout) and :class:`ContainerdError` for everything else; no gRPC exception escapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from types import TracebackType

import grpc
from gpushare_common.adapters.kubeletapi import (
    containerd_task_types_pb2 as types_pb2,
)
from gpushare_common.adapters.kubeletapi import (
    containerd_tasks_v1_pb2 as tasks_pb2,
)
from gpushare_common.adapters.kubeletapi import (
    containerd_tasks_v1_pb2_grpc as tasks_grpc,
)
from gpushare_common.logging import get_logger

from ..ports import ContainerdError, ContainerdUnavailable, TaskExit, TaskNotFound
from .signals import kill_init

log = get_logger("solver.containerd")


def _translate(err: grpc.aio.AioRpcError, what: str) -> ContainerdError:
    code, detail = err.code(), err.details() or ""
    if code == grpc.StatusCode.NOT_FOUND:
        return TaskNotFound(what, detail)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return ContainerdUnavailable(what, f"{code.name} {detail}")
    return ContainerdError(what, f"{code.name} {detail}")


class Tasks:
    """A client of one containerd socket and namespace; use it as an async context manager."""

    def __init__(self, address: str, namespace: str = "k8s.io", call_timeout_s: float = 5.0,
                 direct: bool = False) -> None:
        self.address = address
        self.direct = direct
        self._background: set[asyncio.Future[None]] = set()
        self.namespace = namespace
        self.call_timeout_s = call_timeout_s
        self._metadata = (("containerd-namespace", namespace),)
        self._channel: grpc.aio.Channel | None = None
        self._stub: tasks_grpc.TasksStub | None = None

    async def __aenter__(self) -> Tasks:
        self.open()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    def open(self) -> None:
        target = self.address if "://" in self.address else f"unix://{self.address}"
        self._channel = grpc.aio.insecure_channel(target)
        self._stub = tasks_grpc.TasksStub(self._channel)

    async def close(self) -> None:
        if self._background:
            await asyncio.wait(set(self._background), timeout=self.call_timeout_s)
        if self._channel is not None:
            await self._channel.close()
        self._channel, self._stub = None, None

    @property
    def stub(self) -> tasks_grpc.TasksStub:
        if self._stub is None:
            raise ContainerdUnavailable("call", "client not opened")
        return self._stub

    async def status(self, container_id: str) -> str:
        """The task's status name (``RUNNING``, ``STOPPED``...); TaskNotFound when none."""
        try:
            reply = await self.stub.Get(tasks_pb2.GetRequest(container_id=container_id),
                                        metadata=self._metadata, timeout=self.call_timeout_s)
        except grpc.aio.AioRpcError as err:
            raise _translate(err, f"get task {container_id}") from None
        return str(types_pb2.Status.Name(reply.process.status))

    async def running(self) -> dict[str, str]:
        """Every task of the namespace: container id -> status name."""
        try:
            reply = await self.stub.List(tasks_pb2.ListTasksRequest(),
                                         metadata=self._metadata, timeout=self.call_timeout_s)
        except grpc.aio.AioRpcError as err:
            raise _translate(err, "list tasks") from None
        return {p.id or p.container_id: str(types_pb2.Status.Name(p.status)) for p in reply.tasks}

    async def kill(self, container_id: str, sig: int = signal.SIGKILL) -> None:
        request = tasks_pb2.KillRequest(container_id=container_id, signal=sig, all=True)
        try:
            await self.stub.Kill(request, metadata=self._metadata, timeout=self.call_timeout_s)
        except grpc.aio.AioRpcError as err:
            raise _translate(err, f"kill task {container_id}") from None

    async def wait(self, container_id: str, timeout_s: float) -> int:
        """Block until the task has exited; returns its exit status."""
        try:
            reply = await self.stub.Wait(tasks_pb2.WaitRequest(container_id=container_id),
                                         metadata=self._metadata, timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise _translate(err, f"wait task {container_id}") from None
        return int(reply.exit_status)

    async def pid(self, container_id: str) -> int:
        try:
            reply = await self.stub.Get(tasks_pb2.GetRequest(container_id=container_id),
                                        metadata=self._metadata, timeout=self.call_timeout_s)
        except grpc.aio.AioRpcError as err:
            raise _translate(err, f"get task {container_id}") from None
        return int(reply.process.pid) if reply.process.status == types_pb2.RUNNING else 0

    async def pids(self, container_ids: list[str]) -> dict[str, int]:
        """The init pid of each running task (tasks not found or not running are left out)."""
        async def one(container_id: str) -> int:
            with contextlib.suppress(ContainerdError):
                return await self.pid(container_id)
            return 0

        found = await asyncio.gather(*(one(c) for c in container_ids))
        return {c: pid for c, pid in zip(container_ids, found, strict=True) if pid > 0}

    async def kill_and_wait(self, container_id: str, timeout_s: float, sweep: bool = True,
                            pid: int = 0) -> TaskExit:
        """SIGKILL every process of the container and wait for the task to exit.

        With ``direct`` the init process is signalled at once (see :mod:`.signals`) and
        containerd's Kill (``runc kill --all``) follows once the task has exited, to sweep any
        process left in a pid namespace shared with the pod; without it, or when the direct
        signal could not be sent, containerd's Kill goes first.
        """
        start = time.perf_counter()
        waiter = asyncio.ensure_future(self.wait(container_id, timeout_s))
        sent = False
        if self.direct:  # a pid learnt earlier is checked against the cgroup before the signal
            sent = kill_init(pid, container_id)
            if not sent:
                with contextlib.suppress(ContainerdError):
                    sent = kill_init(await self.pid(container_id), container_id)
        killer = None if sent else asyncio.ensure_future(self._kill_quietly(container_id))
        try:
            status: int | None = await waiter
            gone = False
        except TaskNotFound:
            status, gone = None, True
        except BaseException:
            if killer is not None:
                killer.cancel()
            raise
        if killer is not None:
            self._finish_in_background(killer)
        elif sweep:
            self.sweep([container_id])
        return TaskExit(container_id, status, gone, (time.perf_counter() - start) * 1000, direct=sent)

    def sweep(self, container_ids: list[str]) -> None:
        """containerd's Kill for containers already signalled directly, in the background."""
        for container_id in container_ids:
            self._finish_in_background(asyncio.ensure_future(self._kill_quietly(container_id)))

    def _finish_in_background(self, killer: asyncio.Future[None]) -> None:
        self._background.add(killer)
        killer.add_done_callback(self._background.discard)

    async def _kill_quietly(self, container_id: str) -> None:
        try:
            await self.kill(container_id)
        except TaskNotFound:
            pass  # already finished or no task: the waiter tells which
        except ContainerdError as err:
            log.warning("containerd kill failed", container=container_id, error=str(err))

    async def kill_all(self, container_ids: list[str], timeout_s: float,
                       pids: dict[str, int] | None = None) -> list[TaskExit]:
        """Kill every container in parallel and wait for all of them (errors propagate); the
        sweeps of directly signalled containers start once every task has exited."""
        known = pids or {}
        exits = list(await asyncio.gather(*(self.kill_and_wait(c, timeout_s, False, known.get(c, 0))
                                            for c in container_ids)))
        self.sweep([e.container_id for e in exits if e.direct])
        return exits
