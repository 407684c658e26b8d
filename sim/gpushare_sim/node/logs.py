"""Container logs as the kubelet serves them (`/containerLogs/<ns>/<pod>/<container>`):
the output each container instance wrote to its `log` file, the whole of it or
its last lines, of the current instance or the one before the last restart,
and with `follow` everything it writes until it exits."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpushare_sim.node.spec import container_dir
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
    path: Path
    running: Callable[[], bool]  # whether this instance may still write


def source(node_dir: Path, pod: str, state: ContainerState, previous: bool) -> LogSource:
    """The log of `state`'s current instance, or of the previous one."""
    if previous:
        if not state.previous_id:
            raise LogError(400, f'previous terminated container "{state.name}" in pod "{pod}" not found')
        return LogSource(container_dir(node_dir, state.previous_id) / "log", lambda: False)
    if not state.container_id or state.started_at is None:
        raise LogError(400, f'container "{state.name}" in pod "{pod}" is waiting to start: ContainerCreating')
    current = state.container_id
    return LogSource(container_dir(node_dir, current) / "log",
                     lambda: state.container_id == current and state.exit_code is None)  # fmt: skip


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
    """The log's bytes from the requested start; with `follow`, until the instance has exited
    and everything it wrote has been sent."""
    if not log.path.exists():
        return
    offset = 0 if request.tail_lines is None else await asyncio.to_thread(tail_offset, log.path, request.tail_lines)
    budget, finished = request.limit_bytes, False
    handle = await asyncio.to_thread(open, log.path, "rb")
    try:
        handle.seek(offset)
        while budget is None or budget > 0:
            chunk = handle.read(_BLOCK if budget is None else min(_BLOCK, budget))
            if chunk:
                budget = None if budget is None else budget - len(chunk)
                yield chunk
                continue
            if not request.follow or finished:
                return
            finished = not log.running()  # once it has exited: read what is left, then stop
            if not finished:
                await asyncio.sleep(FOLLOW_POLL_S)
    finally:
        handle.close()
