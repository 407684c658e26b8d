"""Guarded named background tasks and the service runner.

Every background task is started through :meth:`Tasks.spawn`, which names it
and logs a crash or an unexpected exit; a *critical* task that dies stops the
service (the supervisor restarts the process) instead of leaving it half-alive.
:func:`run_service` installs SIGINT/SIGTERM handlers, runs the service's
``main(stop)`` coroutine and exits non-zero when a critical task failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from . import logging as gs_logging
from .adapters.kubeerrors import KubeConfigError
from .ids import IdError
from .logging import get_logger
from .ports import BindError
from .retry import wait_any
from .settings import LogSettings, SettingsError, load_service, part

log = get_logger("tasks")


class Tasks:
    """Owns the background tasks of one service."""

    def __init__(self, service: str = "", stop: asyncio.Event | None = None) -> None:
        self._service = service
        self._stop = stop
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self.failed = asyncio.Event()
        self.failure: BaseException | None = None

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any], critical: bool = True,
              once: bool = False) -> asyncio.Task[Any]:  # fmt: skip
        """``critical``: its failure (or, unless ``once``, its end) stops the service. ``once``: a
        task that ends when its work is done (a start-up), only its failure is one."""
        if name in self._tasks and not self._tasks[name].done():
            coro.close()
            raise ValueError(f"task {name!r} is already running")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        task.add_done_callback(lambda t: self._finished(name, t, critical, once))
        self._tasks[name] = task
        return task

    def _finished(self, name: str, task: asyncio.Task[Any], critical: bool, once: bool = False) -> None:
        if self._tasks.get(name) is task:
            del self._tasks[name]
        if task.cancelled() or (once and task.exception() is None):
            return
        if self._stop is not None and self._stop.is_set() and task.exception() is None:
            return  # a task ending because the service is stopping is not a failure
        error = task.exception()
        if error is not None:
            log.error("task crashed", service=self._service, task=name, error=repr(error))
        elif critical:
            log.warning("task exited unexpectedly", service=self._service, task=name)
        if critical:
            self.failure = error or RuntimeError(f"task {name} exited")
            self.failed.set()

    def names(self) -> list[str]:
        return sorted(self._tasks)

    async def cancel_all(self, timeout: float = 5.0) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                log.warning("task ignored cancellation", service=self._service, task=task.get_name(),
                            where=repr(task.get_stack(limit=3)))


async def wait_first(stop: asyncio.Event, tasks: Tasks) -> None:
    """Return when a stop was requested or a critical task failed."""
    await wait_any(stop, tasks.failed)


def run_service(name: str, main: Callable[[asyncio.Event], Awaitable[int | None]]) -> int:
    """Run ``main(stop)`` until it returns; SIGINT/SIGTERM set ``stop``. A port that cannot be
    bound ends it with one line naming the address (status 1), not a traceback."""

    async def runner() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        log.info("starting", service=name)
        code = await main(stop)
        log.info("stopped", service=name, code=code or 0)
        return code or 0

    try:
        return asyncio.run(runner())
    except KeyboardInterrupt:
        return 130
    except BindError as err:
        print(f"gpushare-{name}: {err}", file=sys.stderr)
        return 1


ServiceMain = Callable[[asyncio.Event], Awaitable[int | None]]
S = TypeVar("S")


def start_service(name: str, settings: type[S], build: Callable[[S], ServiceMain]) -> int:
    """Run a service whose command line was read (:func:`gpushare_common.entry.service_main`):
    its settings read from the environment once, logging set up, ``build(settings)`` returns the
    service's ``main(stop)``. A bad setting prints one line that names the variable and what it
    expects, and exits 2 before anything starts; so does a Kubernetes configuration that cannot be
    used (read when the service connects)."""
    try:
        loaded = load_service(settings)
        logs = part(loaded, LogSettings) or LogSettings()
        gs_logging.setup(logs.level, logs.json)
        service = build(loaded)
    except (SettingsError, IdError, KubeConfigError) as err:
        print(f"gpushare-{name}: {err}", file=sys.stderr)
        return 2
    try:
        return run_service(name, service)
    except KubeConfigError as err:  # read when the service connects: a setting all the same
        print(f"gpushare-{name}: {err}", file=sys.stderr)
        return 2
