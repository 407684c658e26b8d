"""`pods/<name>/log`: the API server checks the request, finds the pod's node and
proxies to that node's kubelet (`/containerLogs/<ns>/<pod>/<container>`) at the
address and port the Node object publishes (`status.addresses` InternalIP,
`status.daemonEndpoints.kubeletEndpoint.Port`), streaming what it answers."""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import h11
import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from . import errors, params
from .context import Context
from .kinds import NODES, PODS
from .routes import Route
from .store import Obj

_PASSED = ("container", "follow", "previous", "tailLines", "limitBytes", "timestamps", "sinceSeconds")
_CHUNK = 65536
CONNECT_TIMEOUT_S = 5.0


def _container(pod: Obj, wanted: str) -> str:
    spec, name = pod.get("spec") or {}, pod["metadata"]["name"]
    names = [c.get("name") for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])]
    if not wanted:
        main = [c.get("name") for c in spec.get("containers") or []]
        if len(main) != 1:
            raise errors.bad_request(f"a container name must be specified for pod {name}, choose one of: "
                                     f"[{' '.join(map(str, main))}]")  # fmt: skip
        return str(main[0])
    if wanted not in names:
        raise errors.bad_request(f"container {wanted} is not valid for pod {name}")
    return wanted


def _check_numbers(query: Any) -> None:
    for name, least in (("tailLines", 0), ("limitBytes", 1), ("sinceSeconds", 1)):
        value = params.integer(query, name)
        if value is not None and value < least:
            raise errors.invalid("PodLogOptions", "", [(name, f"Invalid value: {value}: must be >= {least}")])
    for name in ("follow", "previous", "timestamps"):
        params.flag(query, name)


def kubelet_address(node: Obj) -> tuple[str, int]:
    """Where a node's kubelet serves: its InternalIP (else loopback) and published port."""
    status = node.get("status") or {}
    name = node["metadata"]["name"]
    port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
    if not isinstance(port, int) or not 0 < port < 65536:
        raise errors.ApiError(503, f"node {name} publishes no kubelet endpoint "
                              "(status.daemonEndpoints.kubeletEndpoint.Port)", reason="ServiceUnavailable")  # fmt: skip
    internal = [a.get("address") for a in status.get("addresses") or [] if a.get("type") == "InternalIP"]
    return (internal[0] or "127.0.0.1") if internal else "127.0.0.1", port


async def pod_log(ctx: Context, route: Route, request: Request) -> Response:
    assert route.name is not None
    entry = ctx.store.get(PODS, (route.namespace or "", route.name))
    if entry is None:
        raise errors.not_found("pods", route.name)
    query = request.query_params
    _check_numbers(query)
    container = _container(entry.obj, query.get("container", ""))
    node_name = (entry.obj.get("spec") or {}).get("nodeName")
    if not node_name:
        raise errors.bad_request(f"pod {route.name} does not have a host assigned")
    node = ctx.store.get(NODES, ("", node_name))
    if node is None:
        raise errors.not_found("nodes", node_name)
    host, port = kubelet_address(node.obj)
    passed = {k: v for k, v in query.items() if k in _PASSED and k != "container"}
    path = "/containerLogs/" + "/".join(urllib.parse.quote(p, safe="") for p in
                                        (route.namespace or "", route.name, container))  # fmt: skip
    target = f"{path}?{urllib.parse.urlencode(passed)}" if passed else path
    stream = _KubeletStream(host, port, target, node_name)
    await stream.open()
    return StreamingResponse(stream.body(), media_type="text/plain")


class _KubeletStream:
    """One GET to a kubelet over HTTP/1.1 (h11), its body streamed."""

    def __init__(self, host: str, port: int, target: str, node: str) -> None:
        self.host, self.port, self.target, self.node = host, port, target, node
        self.conn = h11.Connection(our_role=h11.CLIENT)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        except (OSError, TimeoutError) as error:
            raise errors.ApiError(503, f"cannot reach the kubelet of node {self.node} at {self.host}:{self.port}: "
                                  f"{error}", reason="ServiceUnavailable") from None  # fmt: skip
        request = h11.Request(method="GET", target=self.target,
                              headers=[("Host", f"{self.host}:{self.port}"), ("Connection", "close")])  # fmt: skip
        self.writer.write(self.conn.send(request) + self.conn.send(h11.EndOfMessage()))
        response = await self._next()
        if not isinstance(response, h11.Response):
            self.close()
            raise errors.ApiError(503, f"the kubelet of node {self.node} sent no response", reason="ServiceUnavailable")
        if response.status_code != 200:
            text = b"".join([chunk async for chunk in self.body()])
            raise errors.ApiError(response.status_code, _message(text), reason=None)

    async def _next(self) -> Any:
        assert self.reader is not None
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.conn.receive_data(await self.reader.read(_CHUNK))

    async def body(self) -> AsyncIterator[bytes]:
        try:
            while isinstance(event := await self._next(), h11.Data):
                yield bytes(event.data)
        except h11.RemoteProtocolError:
            return  # the kubelet went away mid-stream: the log ends there
        finally:
            self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _message(text: bytes) -> str:
    try:
        body = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return text.decode(errors="replace").strip()
    if isinstance(body, dict):
        return str(body.get("message") or body.get("detail") or body)
    return str(body)
