"""A typed view of one node's part of a JetStream key-value bucket.

A :class:`Store` is a bucket plus a *scope* (``<node>.<kind>``): its keys are
``<scope>.<escaped key>`` in the bucket, so one node's state can be read,
listed and written without touching (or being allowed to touch) another's.
Keys are escaped to one NATS token (``[-/_a-zA-Z0-9]``; everything else,
``.`` and ``=`` included, becomes ``=XX``). Values are msgspec JSON of the type
the caller names. Listing uses a filtered, named, short-lived consumer, so a
permission can limit it to the scope.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
from nats.js import api
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from ..subjects import below, js_direct_get, kv_key, kv_key_of, kv_stream
from .errors import FAILURES, BusError, NotFound, Permanent, Transient, classify, failing

T = TypeVar("T")
_SAFE = re.compile(r"[-/_a-zA-Z0-9]")
_ESCAPED = re.compile(r"=([0-9A-F]{2})")
_DELETED = ("DEL", "PURGE")


def escape_key(key: str) -> str:
    if not key:
        raise ValueError("a key-value key must not be empty")
    return "".join(ch if _SAFE.match(ch) else "".join(f"={b:02X}" for b in ch.encode()) for ch in key)


def unescape_key(key: str) -> str:
    return _ESCAPED.sub(lambda m: bytes.fromhex(m.group(1)).decode("latin-1"), key).encode("latin-1").decode()


Explain = Callable[[str, str, BaseException], BusError]


def _plain(op: str, subject: str, err: BaseException) -> BusError:
    return classify(op, err)


class Store:
    def __init__(self, kv: KeyValue, bucket: str, scope: str, explain: Explain = _plain,
                 consumer: str = "") -> None:
        self.kv = kv
        self.bucket = bucket
        self.scope = scope
        self._explain = explain
        self.consumer = consumer or f"scan-{scope.replace('.', '-')}"  # named in the role's permissions
        self._scanning = asyncio.Lock()  # one scan at a time: each made through the same consumer

    @classmethod
    def bound(cls, js: Any, bucket: str, scope: str, explain: Explain, consumer: str) -> Store:
        """The bucket's store without asking the server (the installer made it with direct gets)."""
        kv = KeyValue(name=bucket, stream=kv_stream(bucket), pre=kv_key(bucket, ""), js=js, direct=True)
        return cls(kv, bucket, scope, explain, consumer)

    def _fail(self, op: str, key: str, err: BaseException) -> BusError:
        subject = kv_key(self.bucket, key)
        if op == "get":
            subject = js_direct_get(kv_stream(self.bucket), subject)
        failure = self._explain(f"{op} {self.bucket}/{key}", subject, err)
        if isinstance(failure, Transient) and "NoResponders" in failure.reason:  # no such bucket (yet)
            return Transient(failure.op, f"{failure.reason}: the bucket does not exist (is the installer done?)")
        return failure

    def _key(self, key: str) -> str:
        return f"{self.scope}.{escape_key(key)}"

    async def get(self, key: str, kind: type[T]) -> T | None:
        """The value under ``key``, None when absent; :class:`Permanent` when it does not decode."""
        try:
            entry = await self.kv.get(self._key(key))
        except FAILURES as err:
            failure = self._fail("get", self._key(key), err)
            if isinstance(failure, NotFound):
                return None
            raise failure from err
        return None if entry.value is None else self._decode(key, entry.value, kind)

    def _decode(self, key: str, raw: bytes, kind: type[T]) -> T:
        try:
            return msgspec.json.decode(raw, type=kind)
        except msgspec.DecodeError as err:
            raise Permanent(f"get {self.bucket}/{self._key(key)}", f"value does not decode: {err}") from err

    async def put(self, key: str, value: Any) -> int:
        with failing("put", lambda _, err: self._fail("put", self._key(key), err)):
            return int(await self.kv.put(self._key(key), msgspec.json.encode(value)))

    async def delete(self, key: str) -> None:
        try:
            await self.kv.delete(self._key(key))
        except FAILURES as err:
            failure = self._fail("delete", self._key(key), err)
            if not isinstance(failure, NotFound):
                raise failure from err

    async def raw_items(self) -> dict[str, bytes]:
        """Every live key of the scope with its raw value (one pass over the bucket's stream)."""
        with failing(f"list {self.bucket}/{self.scope}"):
            async with self._scanning:
                return await _scan(self.kv, self.bucket, self.scope, self.consumer)

    async def keys(self) -> list[str]:
        return sorted(await self.raw_items())

    async def items(self, kind: type[T]) -> dict[str, T]:
        """Every key of the scope decoded as ``kind``; :class:`Permanent` names the first bad one."""
        return {key: self._decode(key, raw, kind) for key, raw in (await self.raw_items()).items()}

    async def items_lenient(self, kind: type[T]) -> tuple[dict[str, T], dict[str, str]]:
        """Like :meth:`items`, but values that do not decode come back apart: key -> reason."""
        good: dict[str, T] = {}
        bad: dict[str, str] = {}
        for key, raw in (await self.raw_items()).items():
            try:
                good[key] = self._decode(key, raw, kind)
            except Permanent as err:
                bad[key] = err.reason
        return good, bad


async def _scan(kv: KeyValue, bucket: str, scope: str, consumer: str, timeout: float = 5.0) -> dict[str, bytes]:
    """Every live key of ``scope`` through ``consumer`` (made fresh: one left by a scan that died
    would be updated, not restarted, and deliver nothing), deleted when done."""
    js, nc = kv._js, kv._js._nc  # the bucket's own JetStream context (same connection)
    stream = kv_stream(bucket)
    inbox = nc.new_inbox()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    sub = await nc.subscribe(inbox, cb=queue.put)
    try:
        await _delete_consumer(js, stream, consumer)
        config = api.ConsumerConfig(name=consumer, filter_subject=below(kv_key(bucket, scope)),
                                    deliver_subject=inbox,
                                    deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
                                    ack_policy=api.AckPolicy.NONE, inactive_threshold=5.0, mem_storage=True,
                                    num_replicas=1)  # fmt: skip
        info = await js._jsm.add_consumer(stream, config)
        found: dict[str, bytes] = {}
        pending = int(info.num_pending or 0)
        while pending > 0:
            try:
                msg = await asyncio.wait_for(queue.get(), timeout)
            except TimeoutError:
                raise Transient(f"list {bucket}/{scope}", f"no key arrived within {timeout}s") from None
            pending = int(msg.metadata.num_pending) if msg.metadata else pending - 1
            key = unescape_key(kv_key_of(bucket, msg.subject).removeprefix(scope + "."))
            if (msg.headers or {}).get("KV-Operation") in _DELETED:
                found.pop(key, None)
            else:
                found[key] = msg.data
        return found
    finally:
        await sub.unsubscribe()
        await _delete_consumer(js, stream, consumer)


async def _delete_consumer(js: Any, stream: str, consumer: str) -> None:
    """Delete ``consumer`` if it exists (a missing one is no error)."""
    try:
        await js._jsm.delete_consumer(stream, consumer)
    except NotFoundError:
        pass
