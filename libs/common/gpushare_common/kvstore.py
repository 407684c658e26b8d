"""A typed view of one JetStream key-value bucket.

Keys are escaped so that any pod key or device ID is a legal NATS key
(``[-/_.a-zA-Z0-9]``; everything else, and ``=``, becomes ``=XX``).  Values
are msgspec JSON of the type the caller names.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec
from nats.js.errors import KeyDeletedError, KeyNotFoundError, NoKeysError
from nats.js.kv import KeyValue

T = TypeVar("T")
_SAFE = re.compile(r"[-/_.a-zA-Z0-9]")
_ESCAPED = re.compile(r"=([0-9A-F]{2})")


def escape_key(key: str) -> str:
    out = []
    for ch in key:
        if _SAFE.match(ch):
            out.append(ch)
        else:
            out.extend(f"={b:02X}" for b in ch.encode())
    if not key:
        raise ValueError("a key-value key must not be empty")
    text = "".join(out)
    if text.startswith("."):
        text = "=2E" + text[1:]
    if text.endswith("."):
        text = text[:-1] + "=2E"
    return text


def unescape_key(key: str) -> str:
    return _ESCAPED.sub(lambda m: bytes.fromhex(m.group(1)).decode("latin-1"), key).encode(
        "latin-1"
    ).decode()


class Store:
    def __init__(self, kv: KeyValue, bucket: str) -> None:
        self.kv = kv
        self.bucket = bucket

    async def get(self, key: str, kind: type[T]) -> T | None:
        try:
            entry = await self.kv.get(escape_key(key))
        except (KeyNotFoundError, KeyDeletedError):
            return None
        if entry.value is None:
            return None
        return msgspec.json.decode(entry.value, type=kind)

    async def put(self, key: str, value: Any) -> int:
        return int(await self.kv.put(escape_key(key), msgspec.json.encode(value)))

    async def delete(self, key: str) -> None:
        try:
            await self.kv.delete(escape_key(key))
        except (KeyNotFoundError, KeyDeletedError):
            pass

    async def keys(self) -> list[str]:
        try:
            return [unescape_key(k) for k in await self.kv.keys()]
        except NoKeysError:
            return []

    async def items(self, kind: type[T]) -> dict[str, T]:
        result: dict[str, T] = {}
        for key in await self.keys():
            value = await self.get(key, kind)
            if value is not None:
                result[key] = value
        return result
