"""The watch stream: newline-delimited JSON events, bookmarks, timeouts, 410 on overflow."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec
from gpushare_common.logging import get_logger

from .errors import ApiError
from .store import Store, Watcher, event_line

log = get_logger("apiserver")
_encode = msgspec.json.Encoder().encode
_CHUNK = 512  # event lines per written chunk


@dataclass(frozen=True, slots=True)
class WatchOptions:
    timeout: float | None  # seconds, None = until the client or the server goes away
    bookmarks: bool
    bookmark_interval: float


def _log_dropped(watcher: Watcher) -> None:
    selection = watcher.selection
    log.warning(
        "watch dropped, its queue is full",
        resource=selection.kind.plural,
        namespace=selection.namespace or "*",
        labels=",".join(r.render() for r in selection.labels),
        fields=",".join(t.render() for t in selection.fields),
    )


def error_line(error: ApiError) -> bytes:
    return event_line("ERROR", _encode(error.status()))


def _bookmark(store: Store, watcher: Watcher) -> bytes:
    kind = watcher.selection.kind
    obj = {
        "kind": kind.kind,
        "apiVersion": kind.api_version,
        "metadata": {"resourceVersion": str(store.rv)},
    }
    return event_line("BOOKMARK", _encode(obj))


def _chunks(lines: list[bytes]) -> list[bytes]:
    return [b"".join(lines[i : i + _CHUNK]) for i in range(0, len(lines), _CHUNK)]


async def stream_events(
    store: Store, watcher: Watcher, first: list[bytes], options: WatchOptions
) -> AsyncIterator[bytes]:
    """Yield the first lines, then every change until timeout, overflow or shutdown."""
    loop = asyncio.get_running_loop()
    deadline = None if options.timeout is None else loop.time() + options.timeout
    try:
        for chunk in _chunks(first):
            yield chunk
        while True:
            watcher.wake.clear()
            if watcher.lines:
                lines = list(watcher.lines)
                watcher.lines.clear()
                for chunk in _chunks(lines):
                    yield chunk
                continue
            if watcher.overflowed:
                _log_dropped(watcher)
                yield error_line(ApiError(410, "watch queue overflowed; list and watch again"))
                return
            if watcher.closed:
                return
            if not await _wait(watcher, loop, deadline, options):
                if deadline is not None and loop.time() >= deadline:
                    return
                yield _bookmark(store, watcher)
    finally:
        store.unwatch(watcher)


async def _wait(
    watcher: Watcher,
    loop: asyncio.AbstractEventLoop,
    deadline: float | None,
    options: WatchOptions,
) -> bool:
    """Wait for a change; False when the deadline or the bookmark interval came first."""
    waits = []
    if deadline is not None:
        waits.append(deadline - loop.time())
    if options.bookmarks:
        waits.append(options.bookmark_interval)
    timeout = max(0.0, min(waits)) if waits else None
    try:
        async with asyncio.timeout(timeout):
            await watcher.wake.wait()
    except TimeoutError:
        return False
    return True
