"""Transport over real netlink, built on pyroute2: its socket class bound to the module's unit.

``socket(AF_NETLINK, SOCK_RAW, unit)`` in the initial network namespace,
bound to a port id of its own; the kernel side is port 0. pyroute2's
asyncio endpoint delivers each datagram to :meth:`_KmodSocket.enqueue`, which
hands it to this transport's queue untouched (the link decodes it), so the
library's sequence-number bookkeeping never sees kmod messages.

:class:`KmodMessage` is the protocol header as a pyroute2 message class
(``nlmsghdr`` + ``struct gpushare_kmod_hdr``), for tools and the layout test;
:func:`classify` reads the bare ``nlmsghdr`` to spot the kernel's own errors.

When the module is unloaded, sends fail (``ECONNREFUSED``) and the socket
reports the error; when the netlink unit does not exist the socket cannot be
created (``EPROTONOSUPPORT``). Both are :class:`TransportError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno as errnos
from typing import Any

from pyroute2.netlink import nlmsg
from pyroute2.netlink.nlsocket import AsyncNetlinkSocket

from .. import protocol
from ..transport import TransportError


class KmodMessage(nlmsg):  # type: ignore[misc]
    """``struct nlmsghdr`` then ``struct gpushare_kmod_hdr`` (pyroute2's field syntax)."""

    fields = (("version", "H"), ("cmd", "H"), ("seq", "I"), ("status", "i"), ("count", "I"))


def classify(data: bytes) -> tuple[int, int]:
    """``(nlmsg_type, errno)`` of a datagram's first message; errno is set for NLMSG_ERROR."""
    message = nlmsg(data)  # the bare nlmsghdr: an error message has no kmod header
    try:
        message.decode()
    except Exception as err:  # pyroute2's decoder raises whatever the bytes make it (struct.error, ...)
        raise TransportError(f"undecodable datagram ({err!r})") from None
    nl_type = int(message["header"]["type"])
    if nl_type != protocol.NLMSG_ERROR:
        return nl_type, 0
    code = int.from_bytes(data[16:20], "little", signed=True) if len(data) >= 20 else -errnos.EIO
    return nl_type, abs(code) or errnos.EIO


class _KmodSocket(AsyncNetlinkSocket):  # type: ignore[misc]
    def __init__(self, unit: int, inbox: asyncio.Queue[bytes]) -> None:
        super().__init__(family=unit)
        self.inbox = inbox

    def enqueue(self, data: bytes, addr: Any) -> None:
        self.inbox.put_nowait(bytes(data))


class NetlinkTransport:
    def __init__(self, unit: int = protocol.NETLINK_UNIT) -> None:
        self.unit = unit
        self.name = f"netlink:{unit}"
        self._inbox: asyncio.Queue[bytes] = asyncio.Queue()
        self._sock: _KmodSocket | None = None

    @property
    def port_id(self) -> int:
        if self._sock is None:
            return 0
        with contextlib.suppress(Exception):  # a socket pyroute2 closed meanwhile has no port
            return int(self._sock.socket.getsockname()[0])
        return 0

    async def open(self) -> None:
        self._inbox = asyncio.Queue()
        try:
            sock = _KmodSocket(self.unit, self._inbox)
            await sock.bind()
        except OSError as err:
            raise TransportError(f"netlink unit {self.unit}: {err.strerror or err}",
                                 err.errno or 0) from None
        except Exception as err:  # pyroute2 wraps some failures (e.g. no free port) in other types
            raise TransportError(f"netlink unit {self.unit}: {err!r}") from None
        self._sock = sock

    async def send(self, data: bytes) -> None:
        if self._sock is None:
            raise TransportError("not open")
        try:
            self._sock.socket.send(data)
        except OSError as err:
            raise TransportError(f"send to netlink unit {self.unit}: {err.strerror}",
                                 err.errno or 0) from None

    async def receive(self) -> bytes:
        data = await self._inbox.get()
        nl_type, code = classify(data)
        if nl_type == protocol.NLMSG_ERROR:
            raise TransportError(f"netlink unit {self.unit}: {errnos.errorcode.get(code, code)}", code)
        return data

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(Exception):  # closing: whatever state pyroute2's socket is in, it goes
                sock.close()
