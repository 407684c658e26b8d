"""Structured logs: every line names its routing keys (node, subject, event, pod, resource).

``log = get_logger("solver", node="n1")``; ``log.info("evicted", pod="ns/p", reason="owner-back")``
prints ``... solver evicted node=n1 pod=ns/p reason=owner-back`` or, with JSON
lines on, one JSON object per line.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None)))


class _KeyFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        keys = getattr(record, "keys", {})
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        text = f"{stamp}.{int(record.msecs):03d} {record.levelname:<5} {record.name} {record.getMessage()}"
        if keys:
            text += " " + " ".join(f"{k}={_show(v)}" for k, v in keys.items())
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(getattr(record, "keys", {}))
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def _show(value: object) -> str:
    text = str(value)
    return json.dumps(text) if (" " in text or not text) else text


class KeyLogger:
    """A logger bound to routing keys; extra keys per call."""

    def __init__(self, logger: logging.Logger, keys: dict[str, Any]) -> None:
        self._logger = logger
        self._keys = keys

    def bind(self, **keys: Any) -> KeyLogger:
        return KeyLogger(self._logger, {**self._keys, **keys})

    def _log(self, level: int, msg: str, exc: bool, keys: dict[str, Any]) -> None:
        if self._logger.isEnabledFor(level):
            merged = {**self._keys, **{k: v for k, v in keys.items() if v is not None}}
            self._logger.log(level, msg, exc_info=exc, extra={"keys": merged}, stacklevel=3)

    def debug(self, msg: str, **keys: Any) -> None:
        self._log(logging.DEBUG, msg, False, keys)

    def info(self, msg: str, **keys: Any) -> None:
        self._log(logging.INFO, msg, False, keys)

    def warning(self, msg: str, **keys: Any) -> None:
        self._log(logging.WARNING, msg, False, keys)

    def error(self, msg: str, **keys: Any) -> None:
        self._log(logging.ERROR, msg, False, keys)

    def exception(self, msg: str, **keys: Any) -> None:
        self._log(logging.ERROR, msg, True, keys)


def get_logger(name: str, **keys: Any) -> KeyLogger:
    return KeyLogger(logging.getLogger(f"gpushare.{name}"), keys)


def setup(level: str = "INFO", json_lines: bool = False, stream: Any = None) -> None:
    """Configure the root handler once (called from a service's ``main()``)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_JsonFormatter() if json_lines else _KeyFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("nats", "uvicorn.access", "kubernetes", "urllib3", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
