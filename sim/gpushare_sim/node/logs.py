"""Container logs as the kubelet serves them (`/containerLogs/<ns>/<pod>/<container>`):
the output each container instance wrote to its log file, the whole of it or
its last lines, of the current instance or the one before the last restart,
and with `follow` everything it writes until it exits. A log in the CRI format
(containerd's `<time> <stream> <F|P> <text>` records) is served as the text the
container wrote, as the kubelet serves it."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpushare_sim.node.model import LogFile
from gpushare_sim.node.status import ContainerState

FOLLOW_POLL_S = 0.1  # how often a followed log is checked for new output
_BLOCK = 8192
_TRUE, _FALSE = ("true", "1", "t", "True", "TRUE"), ("false", "0", "f", "False", "FALSE", "")


class LogError(Exception):
    """A log request that cannot be answered; `code` is the HTTP status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class LogRequest:
    follow: bool = False
    previous: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None


def _flag(query: Mapping[str, str], name: str) -> bool:
    value = query.get(name, "")
    if value not in _TRUE + _FALSE:
        raise LogError(400, f"{name} must be true or false, not {value!r}")
    return value in _TRUE


def _number(query: Mapping[str, str], name: str, least: int) -> int | None:
    value = query.get(name)
    if value is None or value == "":
        return None
    if not value.lstrip("-").isdigit() or int(value) < least:
        raise LogError(400, f"{name} must be an integer >= {least}, not {value!r}")
    return int(value)


def parse(query: Mapping[str, str]) -> LogRequest:
    if _flag(query, "timestamps"):
        raise LogError(400, "timestamps are not recorded by this node's container logs")
    if query.get("sinceSeconds") or query.get("sinceTime"):
        raise LogError(400, "sinceSeconds and sinceTime are not supported: this node records no line times")
    return LogRequest(_flag(query, "follow"), _flag(query, "previous"), _number(query, "tailLines", 0),
                      _number(query, "limitBytes", 1))  # fmt: skip


@dataclass(frozen=True, slots=True)
class LogSource:
    file: LogFile
    running: Callable[[], bool]  # whether this instance may still write

    @property
    def path(self) -> Path:
        return self.file.path


def source(pod: str, state: ContainerState, previous: bool) -> LogSource:
    """The log of `state`'s current instance, or of the previous one."""
    if previous:
        if state.previous_log is None:
            raise LogError(400, f'previous terminated container "{state.name}" in pod "{pod}" not found')
        return LogSource(state.previous_log, lambda: False)
    current = state.log
    if current is None or state.started_at is None:
        raise LogError(400, f'container "{state.name}" in pod "{pod}" is waiting to start: ContainerCreating')
    return LogSource(current, lambda: state.log is current and state.exit_code is None)


def cri_record(line: bytes) -> bytes:
    """The text of one CRI log record (`<time> <stream> <tag> <text>`, without its newline): the
    text, with a newline when the tag says the line is full (F), without when partial (P). A line
    not in that form is passed on as it is, as a full line."""
    parts = line.split(b" ", 3)
    if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr"):
        return line + b"\n"
    text = parts[3] if len(parts) == 4 else b""
    return text if parts[2].split(b":", 1)[0] == b"P" else text + b"\n"


class CriDecoder:
    """CRI log records in, the container's output out; a record cut by a read waits for its end."""

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, chunk: bytes) -> bytes:
        lines = (self._rest + chunk).split(b"\n")
        self._rest = lines.pop()
        return b"".join(cri_record(line) for line in lines)

    def end(self) -> bytes:
        rest, self._rest = self._rest, b""
        return cri_record(rest) if rest else b""


def tail_offset(path: Path, lines: int) -> int:
    """The byte offset where the last `lines` lines of the file start."""
    with open(path, "rb") as handle:
        end = handle.seek(0, os.SEEK_END)
        position, newlines = end, 0
        if lines == 0:
            return end
        while position > 0:
            size = min(_BLOCK, position)
            position -= size
            handle.seek(position)
            block = handle.read(size)
            if position + size == end and block.endswith(b"\n"):
                block = block[:-1]  # the final newline ends the last line, it does not start one
            for index in range(len(block) - 1, -1, -1):
                if block[index] == 0x0A:
                    newlines += 1
                    if newlines == lines:
                        return position + index + 1
        return 0


async def stream(log: LogSource, request: LogRequest) -> AsyncIterator[bytes]:
    """The log's text from the requested start, at most `limit_bytes` of it; with `follow`,
    until the instance has exited and everything it wrote has been sent."""
    budget = request.limit_bytes
    decoder = CriDecoder() if log.file.cri else None
    async with contextlib.aclosing(_chunks(log, request)) as chunks:
        async for chunk in chunks:
            text = chunk if decoder is None else (decoder.feed(chunk) if chunk else decoder.end())
            if budget is not None:
                text, budget = text[:budget], budget - len(text[:budget])
            if text:
                yield text
            if budget == 0:
                return


async def _chunks(log: LogSource, request: LogRequest) -> AsyncGenerator[bytes, None]:
    """The file's bytes from the requested start, then b"" once at its end."""
    if not log.path.exists():
        return
    offset = 0 if request.tail_lines is None else await asyncio.to_thread(tail_offset, log.path, request.tail_lines)
    finished = False
    handle = await asyncio.to_thread(open, log.path, "rb")
    try:
        handle.seek(offset)
        while True:
            chunk = handle.read(_BLOCK)
            if chunk:
                yield chunk
                continue
            if not request.follow or finished:
                yield b""
                return
            finished = not log.running()  # once it has exited: read what is left, then stop
            if not finished:
                await asyncio.sleep(FOLLOW_POLL_S)
    finally:
        handle.close()
