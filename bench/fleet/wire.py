"""A small NATS client for the fleet emulator: thousands of connections in one cheap process.

nats-py spends a task, futures and a flusher on every connection and a future
on every request; emulating a thousand nodes with it would make the emulator,
not the servers, the thing measured. A :class:`Link` is one TCP connection
speaking the NATS client protocol from an :class:`asyncio.Protocol`: it sends
``CONNECT``, ``SUB``, ``PUB``/``HPUB`` and ``PING`` lines, parses ``MSG`` and
``HMSG`` as they arrive and hands each to one callback, answers the server's
``PING``, and reconnects to the next server of the list after a loss, as
nats-py does, re-subscribing what it had. What is published while it is
disconnected is dropped and counted (nats-py would buffer it).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field

CRLF = b"\r\n"


@dataclass(frozen=True, slots=True)
class Message:
    subject: bytes
    reply: bytes
    headers: bytes  # the raw header block (``NATS/1.0 ...``), b"" for a plain MSG
    payload: bytes

    @property
    def status(self) -> int:
        """The status of a header-only answer (408 pull expired, 503 no responders), else 0."""
        if not self.headers.startswith(b"NATS/1.0 "):
            return 0
        code = self.headers[9:12]
        return int(code) if code.isdigit() else 0

    def header(self, name: bytes) -> bytes:
        for line in self.headers.split(CRLF)[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name.lower():
                return value.strip()
        return b""


@dataclass
class LinkStats:
    connects: int = 0
    losses: int = 0
    dropped: int = 0  # publishes while disconnected
    errors: int = 0  # -ERR lines from the server
    last_error: str = ""


OnMessage = Callable[["Link", Message], None]
OnReady = Callable[["Link"], None]


@dataclass(eq=False)
class Link(asyncio.Protocol):
    """One connection. ``servers`` are (host, port); ``first`` is where it starts in the list."""

    servers: list[tuple[str, int]]
    first: int
    name: str
    on_message: OnMessage
    on_ready: OnReady
    reconnect_s: float = 0.5
    stats: LinkStats = field(default_factory=LinkStats)
    subjects: dict[int, bytes] = field(default_factory=dict)  # sid -> subject
    connected: bool = False
    closing: bool = False
    _transport: asyncio.Transport | None = None
    _buffer: bytearray = field(default_factory=bytearray)
    _attempt: int = 0
    _reopening: asyncio.Future[None] | None = None

    # --- connection ----------------------------------------------------------

    async def open(self) -> None:
        """Connect (to each server in turn until one answers), then keep reconnecting."""
        loop = asyncio.get_running_loop()
        while not self.closing:
            host, port = self.servers[(self.first + self._attempt) % len(self.servers)]
            self._attempt += 1
            try:
                await loop.create_connection(lambda: self, host, port)
                return
            except OSError:
                await asyncio.sleep(self.reconnect_s)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport, self._buffer = transport, bytearray()
        connect = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True,
                   "protocol": 1, "name": self.name, "lang": "python", "version": "fleet"}  # fmt: skip
        lines = [b"CONNECT " + json.dumps(connect).encode()]
        lines += [b"SUB " + subject + b" " + str(sid).encode() for sid, subject in self.subjects.items()]
        transport.write(CRLF.join(lines) + CRLF + b"PING" + CRLF)
        self.connected = True
        self.stats.connects += 1
        self.on_ready(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.connected, self._transport = False, None
        if not self.closing:
            self.stats.losses += 1
            asyncio.get_running_loop().call_later(self.reconnect_s, self._reopen)

    def _reopen(self) -> None:
        if not self.closing:
            self._reopening = asyncio.ensure_future(self.open())

    def close(self) -> None:
        self.closing = True
        if self._transport is not None:
            self._transport.close()

    # --- sending -------------------------------------------------------------

    def subscribe(self, subject: str) -> None:
        sid = len(self.subjects) + 1
        self.subjects[sid] = subject.encode()
        if self.connected:  # else connection_made sends it
            self._write(b"SUB " + self.subjects[sid] + b" " + str(sid).encode() + CRLF)

    def publish(self, subject: bytes, payload: bytes, reply: bytes = b"", headers: bytes = b"") -> None:
        head = subject + (b" " + reply if reply else b"")
        if headers:
            size = len(headers)
            line = b"HPUB " + head + b" %d %d" % (size, size + len(payload))
            self._write(line + CRLF + headers + payload + CRLF)
        else:
            self._write(b"PUB " + head + b" %d" % len(payload) + CRLF + payload + CRLF)

    def ping(self) -> None:
        self._write(b"PING" + CRLF)

    def _write(self, data: bytes) -> None:
        if self._transport is None:
            self.stats.dropped += 1
            return
        self._transport.write(data)

    # --- receiving -----------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        position = 0
        while True:
            end = buffer.find(CRLF, position)
            if end < 0:
                break
            line = bytes(buffer[position:end])
            if line.startswith((b"MSG ", b"HMSG ")):
                consumed = self._message(line, buffer, end + 2)
                if consumed < 0:
                    break  # the payload has not all arrived
                position = consumed
                continue
            self._control(line)
            position = end + 2
        del buffer[:position]

    def _message(self, line: bytes, buffer: bytearray, start: int) -> int:
        parts = line.split(b" ")
        if parts[0] == b"HMSG":  # HMSG subject sid [reply] header-size total-size
            header_size, total = int(parts[-2]), int(parts[-1])
            reply = parts[3] if len(parts) == 6 else b""
        else:  # MSG subject sid [reply] size
            header_size, total = 0, int(parts[-1])
            reply = parts[3] if len(parts) == 5 else b""
        if len(buffer) < start + total + 2:
            return -1
        body = bytes(buffer[start:start + total])
        self.on_message(self, Message(parts[1], reply, body[:header_size], body[header_size:]))
        return start + total + 2

    def _control(self, line: bytes) -> None:
        if line == b"PING":
            self._write(b"PONG" + CRLF)
        elif line.startswith(b"-ERR"):
            self.stats.errors += 1
            self.stats.last_error = line[5:].decode(errors="replace").strip(" '")

