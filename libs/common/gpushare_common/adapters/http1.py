"""A small HTTP/1.1 client on asyncio streams, for the Kubernetes adapter.

What the API server needs and nothing more: one origin, keep-alive connections in a pool,
``Content-Length`` and chunked bodies, a streamed response for watches, TLS through an
``ssl.SSLContext``. It costs no memory beyond asyncio and ssl (which every service loads
anyway), where an HTTP library would add 15-20 MB to each process.

Errors: :class:`HttpError` (a malformed response, or a connection closed mid-answer),
``OSError`` (cannot connect, reset), ``TimeoutError``. A request on a kept-alive connection
that the server closed meanwhile is sent again once on a new connection, as long as nothing
of the answer had arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 512 * 1024 * 1024


class HttpError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing: whatever state the stream is in, it goes
            self.writer.close()


class _Stale(Exception):
    """A kept-alive connection the server had closed: nothing of the answer came."""


class Http1Client:
    def __init__(self, base_url: str, ssl_context: ssl.SSLContext | None = None, keep: int = 8) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"{base_url!r} is not an http(s) URL")
        self.tls = url.scheme == "https"
        self.host = url.hostname
        self.port = url.port or (443 if self.tls else 80)
        self.ssl_context = (ssl_context or ssl.create_default_context()) if self.tls else None
        authority = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = authority if url.port is None else f"{authority}:{url.port}"
        self.keep = keep
        self._idle: list[_Conn] = []

    async def _connect(self) -> _Conn:
        reader, writer = await asyncio.open_connection(
            self.host, self.port, ssl=self.ssl_context, server_hostname=self.host if self.tls else None,
            limit=MAX_HEADER_BYTES)
        return _Conn(reader, writer)

    def _head(self, method: str, target: str, headers: dict[str, str], length: int | None) -> bytes:
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.host_header}", "User-Agent: gpushare"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if length is not None:
            lines.append(f"Content-Length: {length}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def request(self, method: str, target: str, headers: dict[str, str], body: bytes | None = None,
                      timeout_s: float = 10.0) -> Response:
        """One exchange; ``target`` is the path with its query string."""
        async with asyncio.timeout(timeout_s):
            reused = bool(self._idle)
            conn = self._idle.pop() if reused else await self._connect()
            try:
                return await self._exchange(conn, method, target, headers, body, reused)
            except _Stale:
                conn.close()
                return await self._exchange(await self._connect(), method, target, headers, body, False)

    async def _exchange(self, conn: _Conn, method: str, target: str, headers: dict[str, str],
                        body: bytes | None, reused: bool) -> Response:
        keep = False
        try:
            length = len(body) if body is not None else (0 if method in ("POST", "PUT", "PATCH") else None)
            conn.writer.write(self._head(method, target, headers, length) + (body or b""))
            await conn.writer.drain()
            try:
                status, answer = await _read_head(conn.reader)
            except (ConnectionError, asyncio.IncompleteReadError) as err:
                if reused and getattr(err, "partial", b"") == b"":
                    raise _Stale() from None
                raise
            content, keep = await _read_body(conn.reader, answer, method)
            return Response(status, answer, content)
        except BaseException:
            conn.close()
            raise
        finally:
            if keep and len(self._idle) < self.keep:
                self._idle.append(conn)
            elif keep:
                conn.close()

    @contextlib.asynccontextmanager
    async def stream(self, target: str, headers: dict[str, str], connect_timeout_s: float = 10.0
                     ) -> AsyncIterator[tuple[int, dict[str, str], AsyncIterator[bytes]]]:
        """A GET whose body is read as it comes (a watch), on a connection of its own."""
        async with asyncio.timeout(connect_timeout_s):
            conn = await self._connect()
        try:
            async with asyncio.timeout(connect_timeout_s):
                conn.writer.write(self._head("GET", target, headers, None))
                await conn.writer.drain()
                status, answer = await _read_head(conn.reader)
            yield status, answer, _body_chunks(conn.reader, answer)
        finally:
            conn.close()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise HttpError("response headers too long") from None
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise HttpError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise HttpError(f"malformed header line {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str], method: str) -> tuple[bytes, bool]:
    """The whole body, and whether the connection may be used again."""
    keep = headers.get("connection", "").lower() != "close"
    if method == "HEAD":
        return b"", keep
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return b"".join([chunk async for chunk in _chunks(reader)]), keep
    if "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            raise HttpError(f"Content-Length {headers['content-length']!r}") from None
        if not 0 <= length <= MAX_BODY_BYTES:
            raise HttpError(f"Content-Length {length} out of range")
        return await reader.readexactly(length), keep
    return await reader.read(MAX_BODY_BYTES), False  # until the server closes


async def _body_chunks(reader: asyncio.StreamReader, headers: dict[str, str]) -> AsyncIterator[bytes]:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        async for chunk in _chunks(reader):
            yield chunk
        return
    left = int(headers["content-length"]) if headers.get("content-length", "").isdigit() else -1
    while left != 0:
        chunk = await reader.read(65536 if left < 0 else min(left, 65536))
        if not chunk:
            return
        left -= len(chunk) if left > 0 else 0
        yield chunk


async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while True:
        size_line = await reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise HttpError(f"malformed chunk size {size_line[:40]!r}") from None
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                pass
            return
        if size > MAX_BODY_BYTES:
            raise HttpError(f"chunk of {size} bytes")
        data = await reader.readexactly(size + 2)
        if data[-2:] != b"\r\n":
            raise HttpError("chunk not followed by CRLF")
        yield data[:-2]
