"""Serve the API with uvicorn (in this thread or a background one) and write a kubeconfig."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import uvicorn
import yaml
from gpushare_common.ports import listen

from . import persist
from .app import ApiSettings, build_app
from .store import Store

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Serve HTTPS with this certificate and key (PEM files); with ``client_ca``, every client
    must present a certificate that CA signed, as the API server's client-ca-file asks."""

    cert: Path
    key: Path
    client_ca: Path | None = None


@dataclass(frozen=True, slots=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port
    api: ApiSettings = field(default_factory=ApiSettings)
    tls: TlsFiles | None = None  # None: plain HTTP


def kubeconfig(url: str, name: str = "gpushare-sim", ca: Path | None = None) -> dict[str, object]:
    """A kubeconfig for the server with a placeholder token (and the CA that signed an HTTPS
    server's certificate)."""
    cluster: dict[str, object] = {"server": url, **({"certificate-authority": str(ca)} if ca else {})}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": {"token": "gpushare-sim"}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
        "preferences": {},
    }


def write_kubeconfig(path: Path, url: str, ca: Path | None = None) -> Path:
    """Write atomically: whoever waits for the file never reads half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(yaml.safe_dump(kubeconfig(url, ca=ca), sort_keys=False))
    partial.replace(path)
    return path


class _Server(uvicorn.Server):
    """uvicorn's server with a thread-safe "accepting connections" event; open watches
    end first on shutdown (they would hold the graceful shutdown up)."""

    def __init__(self, config: uvicorn.Config, store: Store) -> None:
        super().__init__(config)
        self.ready = threading.Event()
        self.store = store

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.store.close_watchers()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGINT/SIGTERM stop the server gracefully and the process exits with status 0
        (uvicorn would re-raise the signal afterwards)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _tls_options(tls: TlsFiles | None) -> dict[str, Any]:
    if tls is None:
        return {}
    client = {"ssl_ca_certs": str(tls.client_ca), "ssl_cert_reqs": ssl.CERT_REQUIRED} if tls.client_ca else {}
    return {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key), **client}


class ApiServer:
    """One emulated API server on a bound socket; `serve()` runs until `stop()`."""

    def __init__(self, settings: ServerSettings, state_file: Path | None = None) -> None:
        self.settings = settings
        self.state_file = state_file
        self.store = Store(settings.api.history, settings.api.watch_queue)
        self.restored = persist.load(self.store, state_file) if state_file and state_file.exists() else 0
        # bound and listening now: clients may connect (and wait) before uvicorn serves
        self.sock = listen(settings.host, settings.port, backlog=1024)
        # headers and body go out as two writes: without NODELAY the body waits for an ACK
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        host, port = self.sock.getsockname()[:2]
        self.address = f"{host}:{port}"
        self.url = f"{'https' if settings.tls else 'http'}://{self.address}"
        app = build_app(self.store, settings.api, lambda: self.address)
        config = uvicorn.Config(
            app,
            log_config=None,  # logging is the process's to configure
            log_level="warning",
            access_log=False,
            lifespan="off",
            http="h11",
            loop="asyncio",
            timeout_graceful_shutdown=2,
            **_tls_options(settings.tls),
        )
        self.server = _Server(config, self.store)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.server.serve(sockets=[self.sock])
        if self.state_file is not None:
            persist.dump(self.store, self.state_file)

    def start_thread(self, timeout: float = 10.0) -> None:
        """Serve from a daemon thread; return once the server accepts connections."""
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self.serve()), name=f"apiserver-{self.address}", daemon=True
        )
        self._thread.start()
        if not self.server.ready.wait(timeout):
            self.stop()
            raise RuntimeError(f"the API emulator did not start on {self.address} in {timeout}s")

    def call(self, fn: Callable[..., T], *args: Any, timeout: float = 30.0) -> T:
        """Run `fn(*args)` on the server's loop (e.g. to seed or inspect the store) and
        return its result; the store must not be touched from another thread."""
        if self.loop is None:
            raise RuntimeError("the API emulator is not serving")

        async def run() -> T:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """End open watches, stop serving and join the thread; safe to call twice."""
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.sock.close()
