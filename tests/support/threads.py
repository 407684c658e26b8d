"""Threads a shared fixture started must end with it: a client it forgot to close keeps its
worker threads for the rest of the worker process, where another test counting its own
threads would find them."""

from __future__ import annotations

import threading
import time

PREFIXES = ("kube-",)  # the Kubernetes adapter's call and watch threads


def snapshot() -> set[threading.Thread]:
    return set(threading.enumerate())


def born_since(before: set[threading.Thread], prefixes: str | tuple[str, ...] = PREFIXES) -> list[threading.Thread]:
    """The live threads named with one of ``prefixes`` that were not in ``before``."""
    return [t for t in threading.enumerate() if t not in before and t.name.startswith(prefixes)]


def assert_none_left(before: set[threading.Thread], what: str, timeout: float = 5) -> None:
    """Fail unless every adapter thread started since ``before`` has ended within ``timeout``."""
    deadline = time.monotonic() + timeout
    while left := [t.name for t in born_since(before)]:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} left threads running (a client not closed?): {sorted(left)}")
        time.sleep(0.05)
