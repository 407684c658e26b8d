"""The ``kubernetes`` package under asyncio: where the API is, calls and watches off the event loop.

Configuration comes from the package's own loaders, in this order: the kubeconfig named in the
settings (``load_kube_config``); the pod's service account when ``KUBERNETES_SERVICE_HOST`` is
set (``load_incluster_config``, whose hook reads the projected token again every minute, so a
rotated token is picked up); the kubeconfig named by ``KUBECONFIG`` (files joined as kubectl
does) or ``~/.kube/config``. A configuration that cannot be used is :class:`KubeConfigError`.

Requests go through ``ApiClient.param_serialize``/``call_api`` for any path, so one way serves
core objects, leases, token reviews and the ``resource.k8s.io`` kinds the package's models may
not know. Answers stay bytes here and are decoded by the caller with msgspec into plain dicts
in the API's JSON shape: the services read dicts, and the package's models would cost a
deserialization per object and a second copy of every pod. Each call runs on a small executor
owned by the client (``KubeSettings.threads`` threads, as many pooled connections).

A watch is the package's :class:`kubernetes.watch.Watch` over a ``watch=true`` list request,
read by a thread of its own (one per open watch), one event per hop to the loop, so a slow
consumer slows the reading rather than queueing events. Stopping shuts the watch's socket down
(``Watch.stop``), which ends the thread's blocking read at once; the read timeout (the watch's
own timeout plus a margin) ends a connection that went silent.

This is the only module that touches the package: what it raises is the adapter's error tree
(:class:`KubeError` and its kinds, by the answer's status; :class:`Retryable` for no answer),
re-exported by :mod:`.kube`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncGenerator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import urllib3
import yaml
from kubernetes import config, watch
from kubernetes.client import ApiClient, ApiException, Configuration
from kubernetes.config.config_exception import ConfigException

from ..settings import KubeSettings
from .kubeerrors import KubeConfigError

__all__ = ["Configuration", "Conflict", "Gone", "Invalid", "KubeClient", "KubeConfigError", "KubeError", "NotFound",
           "Retryable", "load_configuration", "mapped", "query_of", "status_error"]

Obj = dict[str, Any]
SERVICE_HOST = "KUBERNETES_SERVICE_HOST"
USER_AGENT = "gpushare"
WATCH_READ_MARGIN_S = 30  # a watch silent this long past its own timeout is dead
STOP_POLL_S = 0.05
_END = object()  # a watch request's stream is over


def load_configuration(settings: KubeSettings) -> Configuration:
    """The client configuration, from the first source that applies (see the module doc)."""
    configuration = Configuration()
    if settings.kubeconfig:
        _from_kubeconfig(settings.kubeconfig, configuration)
    elif os.environ.get(SERVICE_HOST):  # the package's in-cluster loader reads the environment itself
        _in_cluster(configuration)
    else:
        _from_kubeconfig(os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config"), configuration)
    configuration.connection_pool_maxsize = settings.threads
    return configuration


def _from_kubeconfig(path: str, configuration: Configuration) -> None:
    # the package's parser reads any YAML document: a wrong shape surfaces as one of these
    try:
        config.load_kube_config(config_file=path, client_configuration=configuration,  # type: ignore[no-untyped-call]
                                persist_config=False)
    except ConfigException as err:
        raise KubeConfigError(path, str(err) or type(err).__name__) from None
    except OSError as err:
        raise KubeConfigError(path, f"cannot be read: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        raise KubeConfigError(path, f"is not YAML: {err}") from None
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as err:
        raise KubeConfigError(path, f"is not a usable kubeconfig ({type(err).__name__}: {err})") from None


def _in_cluster(configuration: Configuration) -> None:
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except ConfigException as err:
        raise KubeConfigError("in-cluster", f"{err} (is a service account token mounted?)") from None
    except OSError as err:
        raise KubeConfigError("in-cluster", f"the service account cannot be read: {err}") from None


class KubeError(Exception):
    def __init__(self, message: str, status: int = 0) -> None:
        self.status = status
        super().__init__(message)


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class Gone(KubeError):
    pass


class Invalid(KubeError):
    pass


class Closed(KubeError):
    """A call made after :meth:`KubeClient.close` (a service stopping): nothing was sent."""


class Retryable(KubeError):
    pass


_BY_STATUS: dict[int, type[KubeError]] = {404: NotFound, 409: Conflict, 410: Gone, 422: Invalid, 400: Invalid}


def status_error(status: int, body: Any, what: str, reason: str = "") -> KubeError:
    message = _status_message(body) or reason
    return _BY_STATUS.get(status, Retryable)(f"{what}: {status} {message}".strip(), status)


def _status_message(body: Any) -> str:
    with contextlib.suppress(msgspec.DecodeError, AttributeError, TypeError):
        return str(msgspec.json.decode(body).get("message", ""))
    return ""


@contextlib.contextmanager
def mapped(what: str) -> Iterator[None]:
    """The package's and urllib3's errors as the adapter's."""
    try:
        yield
    except ApiException as err:
        if not err.status:  # the request never got an answer (TLS, for one)
            raise Retryable(f"{what}: {err.reason}") from None
        raise status_error(err.status, err.body, what, str(err.reason or "")) from None
    except (urllib3.exceptions.HTTPError, OSError, TimeoutError) as err:
        raise Retryable(f"{what}: {err!r}") from None
    except ConfigException as err:  # the in-cluster token could not be read again
        raise Retryable(f"{what}: {err}") from None


class KubeClient:
    """One ``ApiClient`` with its executor; :meth:`close` when done."""

    def __init__(self, settings: KubeSettings, configuration: Configuration | None = None) -> None:
        self.settings = settings
        self.api = ApiClient(configuration or load_configuration(settings))
        self.api.user_agent = USER_AGENT
        self._calls = ThreadPoolExecutor(settings.threads, thread_name_prefix="kube-call")
        self._closed = False

    async def call(self, what: str, method: str, path: str, query: list[tuple[str, str]], body: Any,
                   content_type: str) -> bytes:
        """One request, on the executor: the answer's body, or the adapter's error for its status."""
        if self._closed:
            raise Closed(f"{what}: the Kubernetes client is closed")
        loop = asyncio.get_running_loop()
        with mapped(what):
            status, payload = await loop.run_in_executor(self._calls, self._exchange, method, path, query, body,
                                                         content_type)
        if not 200 <= status < 300:
            raise status_error(status, payload, what)
        return payload

    def _exchange(self, method: str, path: str, query: list[tuple[str, str]], body: Any,
                  content_type: str) -> tuple[int, bytes]:
        headers = {"Accept": "application/json", **({"Content-Type": content_type} if body is not None else {})}
        method, url, headers, body, _ = self.api.param_serialize(
            method, path, query_params=query, header_params=headers, body=body, auth_settings=["BearerToken"])
        response = self.api.call_api(method, url, headers, body, _request_timeout=self.settings.qps_timeout_s)
        return response.status, response.read()

    def _watch_request(self, path: str) -> Callable[..., Any]:
        """The list call :meth:`Watch.stream` drives: its keyword arguments become the query."""
        timeout = (self.settings.qps_timeout_s, self.settings.watch_timeout_s + WATCH_READ_MARGIN_S)

        def request(**kwargs: Any) -> urllib3.HTTPResponse:
            kwargs.pop("_preload_content", None)  # always streamed: the watch reads it line by line
            method, url, headers, _, _ = self.api.param_serialize(
                "GET", path, query_params=query_of(**kwargs), header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"])
            return self.api.call_api(method, url, headers, _request_timeout=timeout).response

        return request

    async def watch(self, stop: asyncio.Event, reader: ThreadPoolExecutor, what: str, path: str,
                    **query: Any) -> AsyncGenerator[Obj | None, None]:
        """One watch request's events (``type``, ``object``; BOOKMARK included; None for a line
        that is not JSON) until the server ends it or ``stop``; a 410 (an ERROR event or the
        answer's status) is :class:`Gone`."""
        stream = watch.Watch()
        events = stream.stream(self._watch_request(path), **query)
        loop = asyncio.get_running_loop()
        stopping = asyncio.ensure_future(stop.wait())
        pending: asyncio.Future[Any] | None = None
        try:
            while True:
                pending = loop.run_in_executor(reader, next, events, _END)
                await asyncio.wait([pending, stopping], return_when=asyncio.FIRST_COMPLETED)
                if not pending.done():
                    return
                with mapped(what):
                    event = pending.result()
                if event is _END:
                    return
                yield event
        finally:
            stopping.cancel()
            await _end_watch(stream, pending, events)

    async def close(self) -> None:
        self._closed = True
        self._calls.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(self.api.close)


async def _end_watch(stream: watch.Watch, pending: asyncio.Future[Any] | None, events: Iterator[Any]) -> None:
    """Shut the watch's socket until its reading thread lets go, then close the generator."""
    while pending is not None and not pending.done():
        stream.stop()  # again until the request is open: before that there is no socket to shut
        await asyncio.wait([pending], timeout=STOP_POLL_S)
    if pending is not None and not pending.cancelled():
        pending.exception()  # read (and drop): the reading ended because it was told to
    close = getattr(events, "close", None)
    if close is not None:
        close()


_QUERY_NAMES = {
    "watch": "watch", "resource_version": "resourceVersion", "timeout_seconds": "timeoutSeconds",
    "allow_watch_bookmarks": "allowWatchBookmarks", "field_selector": "fieldSelector",
    "label_selector": "labelSelector",
}


def query_of(**query: Any) -> list[tuple[str, str]]:
    """Keyword arguments as the API's query parameters (empty ones left out)."""
    return [(_QUERY_NAMES.get(k, k), _text(v)) for k, v in query.items() if v not in ("", None)]


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
