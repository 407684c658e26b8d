"""What the driver has prepared, kept in one file so that a restarted driver knows it.

Per claim UID: the claim's name, the devices handed to the kubelet (with their CDI names),
the CDI spec file and the spec itself. Written atomically after every change, read once at
start; an unreadable file is an error naming it (the driver does not guess what it prepared).
"""

from __future__ import annotations

import msgspec


class PreparedDevice(msgspec.Struct, frozen=True, kw_only=True):
    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]


class PreparedClaim(msgspec.Struct, frozen=True, kw_only=True):
    namespace: str
    name: str
    uid: str
    file: str  # the CDI spec file's name in the CDI directory
    devices: tuple[PreparedDevice, ...]
    spec: dict[str, object]
    roles: tuple[str, ...] = ()  # per device: share | exclusive | spot
    cards: tuple[str, ...] = ()  # per device: the card's vendor ID


class PreparedState(msgspec.Struct, kw_only=True):
    version: int = 1
    claims: dict[str, PreparedClaim] = {}


class StateError(ValueError):
    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"prepared-claims file {path}: {reason}")


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(PreparedState)


def encode(state: PreparedState) -> bytes:
    return _encoder.encode(state)


def decode(path: str, data: bytes) -> PreparedState:
    try:
        state = _decoder.decode(data)
    except msgspec.DecodeError as err:
        raise StateError(path, f"undecodable: {err}") from None
    for uid, claim in state.claims.items():
        if claim.uid != uid:
            raise StateError(path, f"claim {claim.namespace}/{claim.name} is filed under {uid!r}, "
                             f"its UID is {claim.uid!r}")
    return state
