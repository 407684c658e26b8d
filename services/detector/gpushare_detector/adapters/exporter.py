"""Fetch a GPU exporter's Prometheus text over HTTP (standard library, in a thread)."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

MAX_BYTES = 32 << 20


class ExporterError(Exception):
    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"exporter {url}: {reason}")


def _fetch(url: str, timeout_s: float) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body: bytes = response.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as err:
        raise ExporterError(url, f"HTTP {err.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise ExporterError(url, f"unreachable: {getattr(err, 'reason', err)}") from None
    if len(body) > MAX_BYTES:
        raise ExporterError(url, f"answer larger than {MAX_BYTES} bytes")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise ExporterError(url, "answer is not UTF-8 text") from None


async def fetch_text(url: str, timeout_s: float) -> str:
    return await asyncio.to_thread(_fetch, url, timeout_s)
