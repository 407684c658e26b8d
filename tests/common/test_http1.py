"""The Kubernetes adapter's HTTP/1.1 client against raw servers: bodies by length, chunked and
to the end; kept-alive connections, a stale one sent again once; malformed answers refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from gpushare_common.adapters.http1 import Http1Client, HttpError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

Answer = Callable[[bytes], bytes | None]  # request head -> raw answer (None: close without answering)


class RawServer:
    def __init__(self, answer: Answer, close_after: int = 0) -> None:
        self.answer = answer
        self.close_after = close_after  # close each connection after this many answers (0: never)
        self.connections = 0
        self.closed = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                raw = self.answer(head)
                if raw is None:
                    break
                writer.write(raw)
                await writer.drain()
                served += 1
                if self.close_after and served >= self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.closed += 1

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


async def serving(answer: Answer, close_after: int = 0) -> RawServer:
    raw = RawServer(answer, close_after)
    raw.server = await asyncio.start_server(raw.handle, "127.0.0.1", 0)
    return raw


def ok(body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def chunked(*parts: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + \
        b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"


@pytest.fixture
async def cleanup() -> AsyncIterator[list[RawServer]]:
    servers: list[RawServer] = []
    yield servers
    for raw in servers:
        assert raw.server is not None
        raw.server.close()


async def test_bodies_by_length_chunked_and_keep_alive(cleanup: list[RawServer]) -> None:
    answers = iter([ok(b'{"a":1}'), chunked(b'{"b"', b":2}"), ok(b"")])
    raw = await serving(lambda head: next(answers))
    cleanup.append(raw)
    client = Http1Client(raw.url)
    first = await client.request("GET", "/api/v1/pods?watch=false", {"Accept": "application/json"})
    second = await client.request("PATCH", "/x", {"Content-Type": "application/merge-patch+json"}, b"{}")
    third = await client.request("DELETE", "/y", {})
    assert (first.status, first.body, second.body, third.body) == (200, b'{"a":1}', b'{"b":2}', b"")
    assert raw.connections == 1  # one kept-alive connection for all three
    assert raw.requests[0].startswith(b"GET /api/v1/pods?watch=false HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Content-Length: 2\r\n\r\n{}" in raw.requests[1]
    await client.close()


async def test_a_connection_the_server_closed_is_replaced_once(cleanup: list[RawServer]) -> None:
    raw = await serving(lambda head: ok(b"x"), close_after=1)
    cleanup.append(raw)
    client = Http1Client(raw.url)
    assert (await client.request("GET", "/a", {})).body == b"x"
    async with asyncio.timeout(5):
        while raw.closed < 1:  # the server closed the kept-alive connection
            await asyncio.sleep(0.005)
    assert (await client.request("POST", "/b", {}, b"1")).body == b"x"
    assert raw.connections == 2 and len(raw.requests) == 2  # sent once on the new connection
    await client.close()


async def test_a_streamed_answer_comes_chunk_by_chunk(cleanup: list[RawServer]) -> None:
    raw = await serving(lambda head: chunked(b'{"type":"ADDED"}\n', b'{"type":"DEL', b'ETED"}\n'))
    cleanup.append(raw)
    client = Http1Client(raw.url)
    async with client.stream("/watch", {}) as (status, _, chunks):
        got = [chunk async for chunk in chunks]
    assert status == 200 and b"".join(got) == b'{"type":"ADDED"}\n{"type":"DELETED"}\n' and len(got) == 3


@pytest.mark.parametrize("answer, error", [
    (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x status line"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n", "Content-Length"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd", "chunk not followed by CRLF"),
])
async def test_malformed_answers_are_http_errors(cleanup: list[RawServer], answer: bytes, error: str) -> None:
    raw = await serving(lambda head: answer)
    cleanup.append(raw)
    with pytest.raises(HttpError, match=error):
        await Http1Client(raw.url).request("GET", "/", {}, timeout_s=2)


async def test_no_answer_and_no_server_are_os_errors(cleanup: list[RawServer]) -> None:
    raw = await serving(lambda head: None)
    cleanup.append(raw)
    with pytest.raises(asyncio.IncompleteReadError):
        await Http1Client(raw.url).request("GET", "/", {}, timeout_s=2)
    assert raw.server is not None
    port = raw.server.sockets[0].getsockname()[1]
    raw.server.close()
    await raw.server.wait_closed()
    with pytest.raises(OSError):
        await Http1Client(f"http://127.0.0.1:{port}").request("GET", "/", {}, timeout_s=2)


@given(st.binary(max_size=300))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_answer_is_a_response_or_a_typed_error(answer: bytes) -> None:
    async def run() -> None:
        raw = await serving(lambda head: answer + b"\r\n\r\n")
        try:
            await Http1Client(raw.url).request("GET", "/", {}, timeout_s=2)
        except (HttpError, asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass
        finally:
            assert raw.server is not None
            raw.server.close()

    asyncio.run(run())
