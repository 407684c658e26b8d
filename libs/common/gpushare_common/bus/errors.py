"""The bus's own errors: every nats-py or msgspec failure leaves ``gpushare_common.bus`` as one
of these, typed by what the caller should do about it.

- :class:`Transient`: may pass if tried again (timeouts, a connection lost or
  being re-established, no responder yet, JetStream unavailable or electing a
  leader, a stream or bucket not created yet). Handlers raise it (or let it
  through) to have their message delivered again.
- :class:`Permanent`: will fail the same way again (permission denied, a bad
  request, a payload over the server's limit, a value that does not decode).

Only the libraries' own failures become bus errors: nats-py's (``nats.errors.Error`` and
JetStream's below it), msgspec's, and the socket's and asyncio's (``OSError``,
``TimeoutError``), caught as :data:`FAILURES` by :func:`failing`. Anything else raised during
a bus call (a ``TypeError`` from a wrong argument) is a bug: it propagates as it is, with its
traceback, never as a bus error that a caller would count as refused and move past. A handler
that raises one of :data:`BUGS` is logged with its traceback and counted apart
(``gpushare_bus_messages{outcome="bug"}``), and its message is kept (:mod:`.jetstream`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

import msgspec
import nats.errors
import nats.js.errors


class BusError(Exception):
    """A NATS operation failed: ``op`` names it (``publish gpushare.v1...``), ``reason`` why."""

    def __init__(self, op: str, reason: str) -> None:
        self.op = op
        self.reason = reason
        super().__init__(f"{op}: {reason}")


class Transient(BusError):
    """Worth retrying: the server, a responder or the connection may be back soon."""


class Permanent(BusError):
    """Not worth retrying: the same request fails the same way."""


class NotFound(Permanent):
    """A key, message or stream asked for does not exist."""


_TRANSIENT_NATS = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.NoServersError,
    nats.errors.FlushTimeoutError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.ServerError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.FetchTimeoutError,
)
# JetStream API error codes that pass: the cluster incomplete or without peers for a
# placement, the meta group without quorum, not the leader, a peer not (yet) a member.
_TRANSIENT_CODES = {10004, 10005, 10008, 10009, 10040}


FAILURES: tuple[type[Exception], ...] = (nats.errors.Error, msgspec.MsgspecError, OSError, TimeoutError)
# what Python raises for a mistake in the code (not a failure of NATS, the API or a peer)
BUGS: tuple[type[Exception], ...] = (TypeError, AttributeError, KeyError, IndexError, NameError, AssertionError,
                                     ZeroDivisionError, RecursionError)  # fmt: skip


@contextlib.contextmanager
def failing(op: str, explain: Callable[[str, BaseException], BusError] | None = None) -> Iterator[None]:
    """Within the block, a failure of nats-py or msgspec leaves as a bus error (``explain``'s,
    :func:`classify` by default); anything else passes unchanged."""
    try:
        yield
    except FAILURES as err:
        raise (explain or classify)(op, err) from err


def classify(op: str, err: BaseException) -> BusError:
    """The bus error for ``err`` (one of :data:`FAILURES`) raised during ``op``."""
    if isinstance(err, BusError):
        return err
    if isinstance(err, (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError,
                        nats.js.errors.NoKeysError)):
        return NotFound(op, "no such key")
    if isinstance(err, nats.js.errors.NotFoundError):
        if getattr(err, "err_code", None) in (10059, 10014):  # stream / consumer not found
            return Transient(op, f"{_text(err)} (not created yet, or being restored)")
        return NotFound(op, _text(err))
    if isinstance(err, (*_TRANSIENT_NATS, asyncio.TimeoutError, ConnectionError, OSError)):
        return Transient(op, _text(err))
    if isinstance(err, nats.js.errors.APIError) and getattr(err, "err_code", None) in _TRANSIENT_CODES:
        return Transient(op, _text(err))
    if isinstance(err, (msgspec.DecodeError, msgspec.EncodeError, msgspec.ValidationError)):
        return Permanent(op, f"bad payload: {err}")
    return Permanent(op, _text(err))


def _text(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
