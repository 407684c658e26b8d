"""The service skeleton: one lifecycle for every gpushare service.

A service's ``app.py`` declares what it consumes, publishes and runs; the
:class:`Skeleton` owns the rest, in this order::

    async with Skeleton(SERVICE, common.http, "nats", "state", stop=stop) as svc:
        bus = await svc.connect(common.nats, node)     # readiness "nats" follows it
        ...                                            # build the service, subscribe
        await svc.serve(status)                        # /healthz /readyz /status /metrics
        svc.spawn("events", consume(...))              # guarded named tasks
        await svc.run_until_stopped()                  # a signal, or a critical task died
    return svc.exit_code

- ``registry``: the service's own Prometheus registry (served on ``/metrics``).
- ``health``: liveness and the named readiness components (``/readyz``);
  :meth:`bus` wires the ``nats`` component to the connection's state.
- ``stop``: set by a signal (or a test); ``stopping``: set on exit, once every
  task has been cancelled (a loop given ``stopping`` ends only by cancellation).
- :meth:`freeze_heap`: a service on a latency path (the kubelet's calls, an owner-back)
  calls it once started, so that no full collection walks the start-up heap mid-call.
- On exit (also after an error during start-up): the tasks are cancelled, then
  everything registered with :meth:`enter`, :meth:`on_exit`, :meth:`serve` and
  :meth:`bus` is closed in reverse order (so the HTTP server stops before the
  resources it reports on, and NATS is drained last).

A service object that must exist before it runs (tests drive it step by step)
creates its skeleton in its constructor and calls :meth:`close` to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import CollectorRegistry

from .http import Health, bound_port, build_app, serve
from .settings import HttpSettings, NatsSettings
from .tasks import Tasks, wait_first

if TYPE_CHECKING:  # the bus (nats-py) is imported only by services that connect
    from fastapi import FastAPI

    from .bus import Bus

T = TypeVar("T")

__all__ = ["Skeleton"]


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

    async def connect(self, nats: NatsSettings, node: str = "", stream: bool = True) -> Bus:
        """:meth:`bus`, connected (retrying until ``stop``); with ``stream``, also wait until the
        installer created the event stream and its buckets."""
        bus = self.bus(nats, node)
        await bus.connect(self.stop)
        if stream:
            await bus.wait_for_stream(self.stop)
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

    async def serve(self, status: Callable[[], dict[str, Any]],
                    routes: Callable[[FastAPI], None] | None = None) -> int:  # fmt: skip
        """Serve ``/healthz``, ``/readyz``, ``/status`` (``status()``) and ``/metrics`` until exit,
        with the service's own ``routes`` added where it has any; the bound port."""
        extra = None
        if routes is not None:  # a web framework only for a service with pages of its own
            from fastapi import FastAPI

            extra = FastAPI(title=f"gpushare {self.name}", docs_url=None, redoc_url=None)
            routes(extra)
        app = build_app(self.name, self.health, self.registry, status, extra)
        server = await self._exit.enter_async_context(serve(app, self.http))
        self.port = bound_port(server)
        return self.port

    def freeze_heap(self) -> int:
        """Move every object alive now out of the collector's sight; how many were moved. A
        full collection over the imported modules (grpc, protobuf, the web framework) would
        otherwise pause whatever call it lands in for milliseconds."""
        gc.collect()
        gc.freeze()
        return gc.get_freeze_count()

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any], critical: bool = True) -> asyncio.Task[Any]:
        """A guarded named task (see :class:`~.tasks.Tasks`), cancelled on exit."""
        return self.tasks.spawn(name, coro, critical)

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
