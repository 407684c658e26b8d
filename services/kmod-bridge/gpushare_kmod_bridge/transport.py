"""One interface for the byte pipe to the kernel module: real netlink or the stand-in's socket.

A transport carries whole netlink messages (the bytes of ``protocol``):
``send`` writes one or more, ``receive`` returns the next datagram (netlink)
or the next framed message (unix socket). Every failure of the pipe is a
:class:`TransportError`; the link then closes it and opens a new one.
"""

from __future__ import annotations

from typing import Protocol


class TransportError(Exception):
    """The pipe to the kernel failed: ``what`` names the step, ``errno`` when known."""

    def __init__(self, what: str, errno: int = 0) -> None:
        self.what = what
        self.errno = errno
        super().__init__(what)


class Transport(Protocol):
    name: str

    @property
    def port_id(self) -> int:
        """Our netlink port id (0 when the transport has none)."""
        ...

    async def open(self) -> None: ...

    async def send(self, data: bytes) -> None: ...

    async def receive(self) -> bytes: ...

    def close(self) -> None: ...
