"""A plain HTTP/1.0 request to a service on loopback (no client library in the tests' way)."""

from __future__ import annotations

import asyncio


async def fetch(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """``(status, headers (lower-case names), body)`` of ``method path`` on 127.0.0.1:``port``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{method} {path} HTTP/1.0\r\nHost: localhost\r\n\r\n".encode())
    await writer.drain()
    response = await reader.read()
    writer.close()
    await writer.wait_closed()
    head, _, body = response.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


async def get_ok(port: int, path: str) -> bytes:
    """The body of ``GET path``, which must answer 200."""
    code, _, body = await fetch(port, path)
    assert code == 200, (path, code, body[:200])
    return body
