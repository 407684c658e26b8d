"""The solver's kills through containerd: signal a container's processes and wait for them to exit.

The only module of the solver that talks to containerd. :class:`Tasks` is the shared
containerd client (:mod:`gpushare_common.adapters.containerd`: task get, list, kill and
wait over gRPC, in one namespace) with the solver's way of killing on top: the init
signalled directly through a pidfd, containerd's Kill as the sweep, many containers at once.
Errors are the client's, re-exported by the task port (``ports``): :class:`TaskNotFound`
(no such task, or its process already finished), :class:`ContainerdUnavailable` (socket
down, timeout) and :class:`ContainerdError` for everything else; no gRPC exception escapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from gpushare_common.adapters.containerd import ContainerdClient
from gpushare_common.logging import get_logger

from ..ports import ContainerdError, TaskExit, TaskNotFound
from .signals import kill_init

log = get_logger("solver.containerd")


class Tasks(ContainerdClient):
    """A client of one containerd socket and namespace; use it as an async context manager.

    ``direct``: signal a task's init through a pidfd first (see :meth:`kill_and_wait`)."""

    def __init__(self, address: str, namespace: str = "k8s.io", call_timeout_s: float = 5.0,
                 direct: bool = False) -> None:
        super().__init__(address, namespace, call_timeout_s)
        self.direct = direct
        self._background: set[asyncio.Future[None]] = set()

    async def __aenter__(self) -> Tasks:
        self.open()
        return self

    async def close(self) -> None:
        """Let the background sweeps finish (at most one call timeout), then close the channel."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=self.call_timeout_s)
        await super().close()

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
