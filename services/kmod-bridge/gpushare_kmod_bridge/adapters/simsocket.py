"""Transport to the kernel stand-in: a unix stream socket carrying netlink messages.

Framing is the module's own: each message starts with ``struct nlmsghdr``
whose ``nlmsg_len`` says how many bytes it has (padded to 4).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct

from ..transport import TransportError

_NLMSGHDR = struct.Struct("<IHHII")


class SimTransport:
    def __init__(self, path: str) -> None:
        self.path = path
        self.name = f"sim:{path}"
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    @property
    def port_id(self) -> int:
        return 0

    async def open(self) -> None:
        try:
            self._reader, self._writer = await asyncio.open_unix_connection(self.path)
        except OSError as err:
            raise TransportError(f"cannot connect to {self.path}: {err.strerror}", err.errno or 0) from None

    async def send(self, data: bytes) -> None:
        if self._writer is None:
            raise TransportError("not open")
        try:
            self._writer.write(data)
            await self._writer.drain()
        except OSError as err:
            raise TransportError(f"send to {self.path}: {err.strerror}", err.errno or 0) from None

    async def receive(self) -> bytes:
        if self._reader is None:
            raise TransportError("not open")
        try:
            head = await self._reader.readexactly(_NLMSGHDR.size)
            length = _NLMSGHDR.unpack(head)[0]
            if length < _NLMSGHDR.size:
                raise TransportError(f"nlmsg_len {length} from {self.path} breaks the framing")
            rest = await self._reader.readexactly(((length + 3) & ~3) - _NLMSGHDR.size)
        except (asyncio.IncompleteReadError, OSError) as err:
            raise TransportError(f"{self.path} closed ({err!r})") from None
        return head + rest

    def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):  # closing: whatever state the stream is in, it goes
                self._writer.close()
        self._reader = self._writer = None
