"""The bus's own errors: every nats-py or msgspec failure leaves ``gpushare_common.bus`` as one
of these, typed by what the caller should do about it.

- :class:`Transient`: may pass if tried again (timeouts, a connection lost or
  being re-established, no responder yet, JetStream unavailable or electing a
  leader, a stream or bucket not created yet). Handlers raise it (or let it
  through) to have their message delivered again.
- :class:`Permanent`: will fail the same way again (permission denied, a bad
  request, a payload over the server's limit, a value that does not decode).
"""

from __future__ import annotations

import asyncio

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


def classify(op: str, err: BaseException) -> BusError:
    """The bus error for ``err`` raised by nats-py (or msgspec) during ``op``."""
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
