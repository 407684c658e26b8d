"""The service skeleton: one lifecycle for every gpushare service.

Every service is a :class:`ServiceBase`: its constructor builds the service's parts and its
:class:`Skeleton` without any I/O; :meth:`ServiceBase.start` connects, subscribes and starts
its guarded tasks; :meth:`ServiceBase.status` is its ``/status`` view, described by its
``status_model``. :meth:`ServiceBase.run` is the same for all::

    serve HTTP (/healthz /readyz /status /metrics answer at once; /readyz says what is missing)
    start (a guarded task: a stop during start-up ends it, a failure ends the service)
    run until a signal, or until a critical task died
    close: cancel the tasks, then close everything registered, last first

A test drives a service step by step (its constructor, then its own steps, then
:meth:`ServiceBase.close`), or all at once: ``async with service.started(): ...``.

The :class:`Skeleton` owns:

- ``registry``: the service's own Prometheus registry (served on ``/metrics``).
- ``health``: liveness and the named readiness components (``/readyz``);
  :meth:`Skeleton.bus` wires the ``nats`` component to the connection's state.
- ``stop``: set by a signal (or a test); ``stopping``: set on exit, once every
  task has been cancelled (a loop given ``stopping`` ends only by cancellation).
- :meth:`Skeleton.freeze_heap`: a service on a latency path (the kubelet's calls, an owner-back)
  calls it once started, so that no full collection walks the start-up heap mid-call.
- On exit (also after an error during start-up): the tasks are cancelled, then
  everything registered with :meth:`Skeleton.enter`, :meth:`Skeleton.on_exit`,
  :meth:`Skeleton.serve` and :meth:`Skeleton.bus` is closed in reverse order (so the HTTP server
  stops before the resources it reports on, and NATS is drained last).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import gc
import inspect
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from .http import Health, OpenStatus, ServiceStatus, StatusView, bound_port, checked_status, serve, service_app
from .logging import get_logger
from .ports import remove_ports, write_ports
from .settings import HttpSettings, NatsSettings
from .tasks import Tasks, wait_first

if TYPE_CHECKING:  # the bus (nats-py) is imported only by services that connect
    from .bus import Bus

T = TypeVar("T")
log = get_logger("service")

__all__ = ["ServiceBase", "Skeleton"]


class Skeleton:
    """One service's registry, health, bus, HTTP server and guarded tasks, closed in order."""

    def __init__(self, name: str, http: HttpSettings, *components: str, stop: asyncio.Event | None = None,
                 registry: CollectorRegistry | None = None) -> None:  # fmt: skip
        self.name = name
        self.http = http
        self.registry = registry or CollectorRegistry()
        self.health = Health(*components)
        self.stop = stop if stop is not None else asyncio.Event()
        self.stopping = asyncio.Event()
        self.tasks = Tasks(name, self.stop)
        self.port = 0
        self._exit = contextlib.AsyncExitStack()
        self._closed = False

    # --- connect ----------------------------------------------------------------

    def bus(self, nats: NatsSettings, node: str = "", role: str = "") -> Bus:
        """The service's NATS connection, not connected yet: the ``nats`` readiness component
        follows its state, and it is drained on exit. ``role``: the NATS role it connects as
        when it is not the service's name (the console is the ``observer``)."""
        from .bus import Bus

        bus = Bus(nats, role or self.name, self.registry, node)
        bus.on_state.append(lambda up: self.health.set("nats", up, "" if up else "disconnected"))
        self._exit.push_async_callback(bus.drain)
        return bus

    async def enter(self, context: AbstractAsyncContextManager[T]) -> T:
        """Enter ``context`` now; it is exited on exit."""
        return await self._exit.enter_async_context(context)

    def on_exit(self, callback: Callable[..., Any], *args: Any) -> None:
        """Call ``callback(*args)`` on exit (awaited when it returns an awaitable), after the tasks
        are cancelled, in the reverse order of registration."""

        async def call() -> None:
            result = callback(*args)
            if inspect.isawaitable(result):
                await result

        self._exit.push_async_callback(call)

    # --- serve and run ----------------------------------------------------------

    async def serve(self, status: StatusView, model: type[ServiceStatus] = OpenStatus,
                    routes: Callable[[FastAPI], None] | None = None) -> int:  # fmt: skip
        """Serve ``/healthz``, ``/readyz``, ``/status`` (``status()``, checked against ``model``) and
        ``/metrics`` until exit, with the service's own ``routes`` added where it has any; the
        bound port."""
        app = service_app(self.name, self.health, self.registry, status, model)
        if routes is not None:
            routes(app)
        server = await self._exit.enter_async_context(serve(app, self.http))
        self.port = bound_port(server)
        if self.http.ports_dir:  # bind, then report: the launcher reads the port it got
            write_ports(self.http.ports_dir, self.name, {"http": [f"http://{self.http.host}:{self.port}"]})
            self.on_exit(remove_ports, self.http.ports_dir, self.name)
        return self.port

    def freeze_heap(self) -> int:
        """Move every object alive now out of the collector's sight; how many were moved. A
        full collection over the imported modules (grpc, protobuf, the web framework) would
        otherwise pause whatever call it lands in for milliseconds."""
        gc.collect()
        gc.freeze()
        return gc.get_freeze_count()

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any], critical: bool = True,
              once: bool = False) -> asyncio.Task[Any]:  # fmt: skip
        """A guarded named task (see :class:`~.tasks.Tasks`), cancelled on exit."""
        return self.tasks.spawn(name, coro, critical, once)

    async def run_until_stopped(self) -> None:
        """Return when ``stop`` is set or a critical task failed."""
        await wait_first(self.stop, self.tasks)

    @property
    def exit_code(self) -> int:
        """The process's exit status: 1 when a critical task failed, else 0."""
        return 1 if self.tasks.failure is not None else 0

    # --- stop -------------------------------------------------------------------

    async def close(self) -> None:
        """Cancel the tasks, set ``stopping``, then close everything registered, last first."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.tasks.cancel_all()
            self.stopping.set()
        finally:
            await self._exit.aclose()

    async def __aenter__(self) -> Skeleton:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:  # fmt: skip
        await self.close()


class ServiceBase(abc.ABC):
    """One gpushare service: its parts and :class:`Skeleton`, built by the constructor without
    I/O; :meth:`start`; its ``/status`` view; the same :meth:`run` for every service."""

    status_model: ClassVar[type[ServiceStatus]] = OpenStatus
    """The ``/status`` response model (``/openapi.json``, ``/docs``); ``status()`` is checked
    against it."""
    freeze_after_start: ClassVar[bool] = False
    """A service on a latency path (the kubelet's calls): :meth:`run` freezes the start-up heap
    once started (:meth:`Skeleton.freeze_heap`)."""

    def __init__(self, name: str, http: HttpSettings, *components: str, stop: asyncio.Event | None = None,
                 registry: CollectorRegistry | None = None) -> None:  # fmt: skip
        self.skeleton = Skeleton(name, http, *components, stop=stop, registry=registry)

    @property
    def health(self) -> Health:
        return self.skeleton.health

    @property
    def registry(self) -> CollectorRegistry:
        return self.skeleton.registry

    @property
    def stopping(self) -> asyncio.Event:
        """Set once every task is cancelled: a loop given it ends only by cancellation."""
        return self.skeleton.stopping

    @property
    def port(self) -> int:
        """The HTTP port bound (0 until served)."""
        return self.skeleton.port

    @abc.abstractmethod
    async def start(self) -> None:
        """Connect, subscribe, start the guarded tasks (HTTP is served already)."""

    @abc.abstractmethod
    def status(self) -> Mapping[str, Any]:
        """The service's own ``/status`` fields (``service`` and ``health`` are added)."""

    def status_view(self) -> ServiceStatus:
        """``/status`` as served, checked against ``status_model``."""
        return checked_status(self.skeleton.name, self.health, self.status, self.status_model)

    def routes(self, app: FastAPI) -> None:
        """Add the service's own routes (pages, an API) to its HTTP application; none by default."""
        return None

    async def serve(self) -> int:
        """Serve HTTP until exit; the bound port."""
        return await self.skeleton.serve(self.status, self.status_model, self.routes)

    async def run(self) -> int:
        """Serve, start, run until stopped, close; the process's exit status."""
        svc = self.skeleton
        async with svc:
            await self.serve()
            svc.spawn("start", self._start(), once=True)
            await svc.run_until_stopped()
        return svc.exit_code

    async def _start(self) -> None:
        await self.start()
        if self.freeze_after_start:
            log.info("start-up heap frozen", service=self.skeleton.name, objects=self.skeleton.freeze_heap())

    @contextlib.asynccontextmanager
    async def started(self) -> AsyncIterator[Self]:
        """Served and started (for a test or a tool that drives the service); closed on exit."""
        async with self.skeleton:
            await self.serve()
            await self.start()
            yield self

    async def close(self) -> None:
        """Cancel the tasks, then close everything registered, last first; safe twice."""
        await self.skeleton.close()
