"""Kubernetes' protobuf encoding of request bodies, for the kinds kubectl sends that way.

client-go's generated clients send built-in kinds as protobuf and never fall
back to JSON (a 415 only makes them retry CBOR as JSON). kubectl uses them for
`create namespace`, `create serviceaccount`, `create token`, `drain` (evictions)
and delete options. A body is `k8s\\x00` followed by a `runtime.Unknown`
message (typeMeta, raw object bytes); the object's fields are decoded with the
field numbers of the published `generated.proto` files and come out in the
API's JSON shape. Other kinds get a 415 naming what is decoded.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

MAGIC = b"k8s\x00"
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"


class ProtobufError(ValueError):
    """A body that is not a well-formed Kubernetes protobuf message; names where it broke."""


class UnsupportedKind(ProtobufError):
    """A well-formed envelope around a kind this module does not decode."""


# message -> field number -> (JSON name, type); "[]" before a type: repeated; "{}": map of strings
_SCHEMAS: dict[str, dict[int, tuple[str, str]]] = {
    "Unknown": {1: ("typeMeta", "TypeMeta"), 2: ("raw", "bytes"), 3: ("contentEncoding", "string"),
                4: ("contentType", "string")},
    "TypeMeta": {1: ("apiVersion", "string"), 2: ("kind", "string")},
    "Time": {1: ("seconds", "int"), 2: ("nanos", "int")},
    "ObjectMeta": {1: ("name", "string"), 2: ("generateName", "string"), 3: ("namespace", "string"),
                   4: ("selfLink", "string"), 5: ("uid", "string"), 6: ("resourceVersion", "string"),
                   7: ("generation", "int"), 8: ("creationTimestamp", "time"),
                   9: ("deletionTimestamp", "time"), 10: ("deletionGracePeriodSeconds", "int"),
                   11: ("labels", "{}"), 12: ("annotations", "{}"),
                   13: ("ownerReferences", "[]OwnerReference"), 14: ("finalizers", "[]string")},
    "OwnerReference": {1: ("kind", "string"), 3: ("name", "string"), 4: ("uid", "string"),
                       5: ("apiVersion", "string"), 6: ("controller", "bool"),
                       7: ("blockOwnerDeletion", "bool")},
    "Namespace": {1: ("metadata", "ObjectMeta"), 2: ("spec", "NamespaceSpec")},
    "NamespaceSpec": {1: ("finalizers", "[]string")},
    "ServiceAccount": {1: ("metadata", "ObjectMeta"), 2: ("secrets", "[]ObjectReference"),
                       3: ("imagePullSecrets", "[]LocalObjectReference"),
                       4: ("automountServiceAccountToken", "bool")},
    "ObjectReference": {1: ("kind", "string"), 2: ("namespace", "string"), 3: ("name", "string"),
                        4: ("uid", "string"), 5: ("apiVersion", "string"),
                        6: ("resourceVersion", "string"), 7: ("fieldPath", "string")},
    "LocalObjectReference": {1: ("name", "string")},
    "TokenRequest": {1: ("metadata", "ObjectMeta"), 2: ("spec", "TokenRequestSpec")},
    "TokenRequestSpec": {1: ("audiences", "[]string"), 4: ("expirationSeconds", "int"),
                         3: ("boundObjectRef", "BoundObjectReference")},
    "BoundObjectReference": {1: ("kind", "string"), 2: ("apiVersion", "string"), 3: ("name", "string"),
                             4: ("uid", "string")},
    "TokenReview": {1: ("metadata", "ObjectMeta"), 2: ("spec", "TokenReviewSpec")},
    "TokenReviewSpec": {1: ("token", "string"), 2: ("audiences", "[]string")},
    "Eviction": {1: ("metadata", "ObjectMeta"), 2: ("deleteOptions", "DeleteOptions")},
    "DeleteOptions": {1: ("gracePeriodSeconds", "int"), 2: ("preconditions", "Preconditions"),
                      3: ("orphanDependents", "bool"), 4: ("propagationPolicy", "string"),
                      5: ("dryRun", "[]string")},
    "Preconditions": {1: ("uid", "string"), 2: ("resourceVersion", "string")},
}  # fmt: skip
# the kinds a body may carry (apiVersion, kind) -> message
TOP_LEVEL = {
    ("v1", "Namespace"): "Namespace",
    ("v1", "ServiceAccount"): "ServiceAccount",
    ("authentication.k8s.io/v1", "TokenRequest"): "TokenRequest",
    ("authentication.k8s.io/v1", "TokenReview"): "TokenReview",
    ("policy/v1", "Eviction"): "Eviction",
    ("meta.k8s.io/v1", "DeleteOptions"): "DeleteOptions",
    ("v1", "DeleteOptions"): "DeleteOptions",
}


def decode(body: bytes) -> dict[str, Any]:
    """A protobuf request body as the JSON object it stands for (apiVersion and kind set)."""
    if not body.startswith(MAGIC):
        raise ProtobufError("the body does not start with the Kubernetes protobuf prefix 'k8s\\x00'")
    envelope = _message("Unknown", body[len(MAGIC) :], "envelope")
    type_meta = envelope.get("typeMeta") or {}
    api_version, kind = type_meta.get("apiVersion", ""), type_meta.get("kind", "")
    message = TOP_LEVEL.get((api_version, kind))
    if message is None:
        known = ", ".join(sorted(f"{v}/{k}" if "/" not in v else f"{v} {k}" for v, k in TOP_LEVEL))
        raise UnsupportedKind(f"protobuf bodies of {api_version or '?'} {kind or '?'} are not decoded "
                            f"(decoded: {known}); send JSON")  # fmt: skip
    if envelope.get("contentEncoding"):
        raise ProtobufError(f"content encoding {envelope['contentEncoding']!r} is not supported")
    raw = envelope.get("raw", b"")
    return {"apiVersion": api_version, "kind": kind, **_message(message, raw, kind)}


def _message(name: str, data: bytes, where: str) -> dict[str, Any]:
    schema = _SCHEMAS[name]
    result: dict[str, Any] = {}
    reader = _Reader(data, where)
    while not reader.done():
        number, wire = reader.tag()
        field = schema.get(number)
        if field is None:
            reader.skip(wire)
            continue
        json_name, kind = field
        _store(result, json_name, kind, reader.value(wire), f"{where}.{json_name}")
    return result


def _store(result: dict[str, Any], json_name: str, kind: str, value: Any, where: str) -> None:
    if kind == "{}":
        entry = _message_map_entry(value, where)
        result.setdefault(json_name, {})[entry[0]] = entry[1]
    elif kind.startswith("[]"):
        result.setdefault(json_name, []).append(_scalar(kind[2:], value, where))
    else:
        decoded, earlier = _scalar(kind, value, where), result.get(json_name)
        # a message field seen twice is merged, as protobuf parsers do
        if isinstance(earlier, dict) and isinstance(decoded, dict):
            decoded = {**earlier, **decoded}
        result[json_name] = decoded


def _scalar(kind: str, value: Any, where: str) -> Any:
    if kind == "string":
        return _text(value, where)
    if kind == "bytes":
        return _bytes(value, where)
    if kind == "bool":
        return bool(_int(value, where))
    if kind == "int":
        number = _int(value, where)
        return number - (1 << 64) if number >= 1 << 63 else number  # two's complement int64
    if kind == "time":
        stamp = _message("Time", _bytes(value, where), where)
        return datetime.fromtimestamp(stamp.get("seconds", 0), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return _message(kind, _bytes(value, where), where)


def _message_map_entry(value: Any, where: str) -> tuple[str, str]:
    reader, key, item = _Reader(_bytes(value, where), where), "", ""
    while not reader.done():
        number, wire = reader.tag()
        if number in (1, 2):
            text = _text(reader.value(wire), where)
            key, item = (text, item) if number == 1 else (key, text)
        else:
            reader.skip(wire)
    return key, item


def _text(value: Any, where: str) -> str:
    try:
        return _bytes(value, where).decode()
    except UnicodeDecodeError:
        raise ProtobufError(f"{where}: not valid UTF-8") from None


def _bytes(value: Any, where: str) -> bytes:
    if not isinstance(value, bytes):
        raise ProtobufError(f"{where}: expected a length-delimited field, found a number")
    return value


def _int(value: Any, where: str) -> int:
    if not isinstance(value, int):
        raise ProtobufError(f"{where}: expected a number, found a length-delimited field")
    return value


class _Reader:
    """The protobuf wire format: varints, fixed 32/64-bit values, length-delimited bytes."""

    def __init__(self, data: bytes, where: str) -> None:
        self.data, self.pos, self.where = data, 0, where

    def done(self) -> bool:
        return self.pos >= len(self.data)

    def varint(self) -> int:
        result = shift = 0
        while True:
            if self.pos >= len(self.data):
                raise ProtobufError(f"{self.where}: truncated varint at byte {self.pos}")
            byte = self.data[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return result & ((1 << 64) - 1)
            shift += 7
            if shift >= 70:
                raise ProtobufError(f"{self.where}: varint longer than 10 bytes at byte {self.pos}")

    def tag(self) -> tuple[int, int]:
        key = self.varint()
        number, wire = key >> 3, key & 7
        if number == 0 or wire not in (0, 1, 2, 5):
            raise ProtobufError(f"{self.where}: invalid field key {key} at byte {self.pos}")
        return number, wire

    def take(self, size: int) -> bytes:
        if size > len(self.data) - self.pos:
            raise ProtobufError(f"{self.where}: field of {size} bytes runs past the end at byte {self.pos}")
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def value(self, wire: int) -> int | bytes:
        if wire == 0:
            return self.varint()
        if wire == 2:
            return self.take(self.varint())
        raw = self.take(8 if wire == 1 else 4)
        return int.from_bytes(raw, "little")

    def skip(self, wire: int) -> None:
        self.value(wire)
