"""What the driver has prepared, so that a restarted driver knows it.

Per claim UID: the claim's name, the devices handed to the kubelet (with their CDI names),
the CDI spec file and the spec itself. Each claim's record travels in its own CDI spec file,
as the spec's annotation ``gpushare.k8s.io/prepared-claim`` (CDI 0.6.0 spec annotations): one
atomic write prepares a claim, one unlink unprepares it, and the spec files are the state.
Older versions kept every record in one state file (:class:`PreparedState`); it is read once
at start, merged and removed. An unreadable state file is an error naming it (the driver
does not guess what it prepared).
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


RECORD_KEY = "gpushare.k8s.io/prepared-claim"


class ClaimRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A prepared claim without its spec: what the spec file's annotation carries."""

    namespace: str
    name: str
    uid: str
    file: str
    devices: tuple[PreparedDevice, ...]
    roles: tuple[str, ...] = ()
    cards: tuple[str, ...] = ()


def with_record(claim: PreparedClaim) -> PreparedClaim:
    """The claim with its record in its spec's annotations."""
    record = ClaimRecord(namespace=claim.namespace, name=claim.name, uid=claim.uid, file=claim.file,
                         devices=claim.devices, roles=claim.roles, cards=claim.cards)
    annotations = {**_annotations(claim.spec), RECORD_KEY: msgspec.json.encode(record).decode()}
    return msgspec.structs.replace(claim, spec={**claim.spec, "annotations": annotations})


def record_of(file: str, spec: object) -> PreparedClaim | None:
    """The claim a spec file records; None when it carries no valid record of itself."""
    if not isinstance(spec, dict):
        return None
    value = _annotations(spec).get(RECORD_KEY)
    if not isinstance(value, str):
        return None
    try:
        record = msgspec.json.decode(value, type=ClaimRecord)
    except msgspec.DecodeError:
        return None
    if record.file != file:
        return None
    return PreparedClaim(namespace=record.namespace, name=record.name, uid=record.uid, file=record.file,
                         devices=record.devices, spec=spec, roles=record.roles, cards=record.cards)


def _annotations(spec: dict[str, object]) -> dict[str, object]:
    found = spec.get("annotations")
    return dict(found) if isinstance(found, dict) else {}


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
